"""``cuvil.compile``: the user-facing entry point and the callable it returns.

:class:`CompiledFunction` keys each call (argument tree, tensor metadata, module state,
autocast), finds the compiled variant whose guards hold or compiles one (a warm start,
or capture, then the target), runs it, and falls back to eager with a reason; its
:class:`Stats` say what happened. The variants and how one runs are in
:mod:`cuvil.artifacts`, the checks of ``compile``'s own arguments in
:mod:`cuvil.compile_args`, and :func:`~cuvil.inspection.explain` in :mod:`cuvil.inspection`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import types
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from cuvil import autocast, fast_path, warm
from cuvil.arguments import PLAIN_TENSORS, check_module_state, check_tensors
from cuvil.artifacts import Artifact, ModuleSnapshot, lifted_keys, lifted_ok, run_artifact
from cuvil.capabilities import check_capabilities
from cuvil.compile_args import OptionError, check_dims, check_options, leaf_name
from cuvil.errors import CompileError
from cuvil.frontend import arg_objects, hooks
from cuvil.frontend.capture import capture, module_state
from cuvil.guards import explain_structure, leaf_key
from cuvil.submit import SerialQueue
from cuvil_runtime import gc_pause
from cuvil_runtime.cache import CompileCache
from cuvil_runtime.registry import TargetMisconfiguredError
from cuvil_runtime.target import CompileOptions, TargetError

FALLBACKS = ("eager", "error")
#: compiled variants one function keeps (the oldest go first); past MANY_RECOMPILES a
#: warning names the reason, once. Bounds memory when a guarded value changes every call.
MAX_ARTIFACTS = 64
MANY_RECOMPILES = 16
#: recompile reasons kept in ``stats.recompile_reasons`` (the most recent)
MAX_REASONS = 256

#: executables of this process by (graph hash, target, options): compiled functions
#: whose captured graphs are the same share one compile
_EXECUTABLES = CompileCache()


_CHAINABLE = frozenset(
    {"eval", "train", "to", "cpu", "cuda", "float", "half", "double", "bfloat16", "requires_grad_"}
)


class CuvilFallbackWarning(UserWarning):
    """A call ran eagerly because Cuvil could not compile it (``fallback="eager"``)."""


@dataclass
class Stats:
    """What happened to a compiled callable so far."""

    compiles: int = 0
    cache_hits: int = 0
    #: compiles whose capture came from the cache of captured variants (no tracing)
    warm_starts: int = 0
    fallbacks: int = 0
    recompile_reasons: list[str] = field(default_factory=list)
    fallback_reasons: list[str] = field(default_factory=list)
    #: how the target runs the compiled programs, where it chose (``cuda``: a program
    #: that runs without CUDA Graphs, and why)
    notes: list[str] = field(default_factory=list)


class CompiledFunction:
    """The callable ``cuvil.compile`` returns: same signature, compiled on first call."""

    #: its artifacts and stats are the compiler's, not state of a program that holds it
    #: (``model.forward = cu.compile(model.forward)``: cuvil/frontend/object_state.py)
    __cuvil_bookkeeping__ = True

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        target: str | None,
        opt_level: int,
        dynamic: bool,
        fallback: str,
        dims: dict[str, dict[int, str | None]] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise ValueError(f"opt_level must be an int in 0..3, got {opt_level!r}")
        if target is not None:
            from cuvil_runtime.registry import get_target

            # unknown or unavailable targets fail here, loudly
            check_options(options or {}, get_target(target).capabilities, target)
        #: the target's own options, sorted (they are part of CompileOptions, so of cache keys)
        self.options: tuple[tuple[str, Any], ...] = tuple(sorted((options or {}).items()))
        self.module: torch.nn.Module | None = fn if isinstance(fn, torch.nn.Module) else None
        self.fn = fn
        self.target = target
        self.opt_level = opt_level
        self.dynamic = dynamic
        #: int attributes of argument objects are size symbols ([Note: int attributes are
        #: sizes]) until a capture with them as sizes fails; then they are values
        self.int_sizes = dynamic
        self.fallback = fallback
        self.dims = check_dims(dims)
        self.stats = Stats()
        self.artifacts: list[Artifact] = []
        self._warned: set[str] = set()
        #: number of positional tensors -> the tree spec of ``(args, {})`` (see __call__)
        self._flat_specs: dict[int, Any] = {}
        self._snapshot: ModuleSnapshot | None = None
        sig_fn = type(self.module).forward if self.module is not None else fn
        try:
            sig = inspect.signature(sig_fn)
        except (TypeError, ValueError):
            sig = None
        if sig is not None and self.module is not None:
            params = list(sig.parameters.values())[1:]  # drop self
            sig = sig.replace(parameters=params)
        self._sig = sig
        if sig is not None and self.dims:
            unknown = sorted(set(self.dims) - set(sig.parameters))
            if unknown:
                raise ValueError(
                    f"dims names {unknown}, which are not parameters of {getattr(fn, '__qualname__', fn)} "
                    f"(parameters: {list(sig.parameters)})"
                )
        self._last: Artifact | None = None
        #: the fast path of the variant served last ([Note: the fast path of a hit])
        self._fast: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None
        #: serializes compiles (re-entrant: capture may call this function again)
        self._compile_lock = threading.RLock()
        #: ``submit``'s calls of this function, in order
        self._queue = SerialQueue()
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return (
            f"<cuvil compiled {self.__qualname__} target={self.target or 'auto'} opt_level={self.opt_level}>"
        )

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def __getattr__(self, name: str) -> Any:
        # a compiled module still exposes the module's attributes (parameters(), ...);
        # methods that return the module for chaining return the compiled wrapper
        module = self.__dict__.get("module")
        if module is None:
            raise AttributeError(name)
        attr = getattr(module, name)
        if name in _CHAINABLE:

            @functools.wraps(attr)
            def chained(*args: Any, **kwargs: Any) -> CompiledFunction:
                attr(*args, **kwargs)
                return self

            return chained
        if (
            isinstance(attr, types.MethodType)
            and attr.__self__ is module
            and getattr(torch.nn.Module, name, None) is None
        ):
            return _routed(self, module, attr)
        return attr

    @property
    def graphs(self) -> list[Any]:
        return [a.captured.graph for a in self.artifacts if a.captured is not None]

    # -- the call path ---------------------------------------------------------
    def _check_call(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call as the caller made it, once it binds to the signature (a wrong arity is
        a ``TypeError`` naming the function).

        [Note: calls are replayed as made] The traced call passes the same positional and
        keyword arguments, defaults not filled in: decorators that take ``*args, **kwargs``
        (transformers wraps ``forward`` so, and sets ``kwargs["use_cache"]`` itself) see
        what they see in eager, where filling a default in as a positional argument made
        "got multiple values for argument 'use_cache'". Defaults are then read by the
        function itself, and guarded (``cuvil.frontend.capture``)."""
        if self._sig is not None:
            try:
                self._sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self.__qualname__}(): {e}") from None
        return tuple(args), dict(kwargs)

    def _leaf_names(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
        """Readable names of the argument leaves (``x``, ``xs_0``): graph input and symbol names."""
        if self._sig is not None:
            params = [p for p in self._sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
            names: list[str] = []
            for p in params:
                if p.kind is p.VAR_POSITIONAL:
                    names += [f"{p.name}_{i}" for i in range(len(args) - len(names))]
                elif p.kind is not p.KEYWORD_ONLY:
                    names.append(p.name)
        else:
            names = [f"arg{i}" for i in range(len(args))]
        try:
            with_path, _ = arg_objects.flatten_with_path((args, kwargs))
        except ValueError:  # a type registered without flatten_with_keys_fn: number its leaves
            tops = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
            out = []
            for name, arg in [*tops, *kwargs.items()]:
                inner, inner_spec = arg_objects.flatten(arg)
                out += [name] if inner_spec.is_leaf() else [f"{name}_{j}" for j in range(len(inner))]
            return out
        return [leaf_name(path, names) for path, _ in with_path]

    def _arg_name(self, path: tuple[int, ...], tree: tuple[tuple[Any, ...], dict[str, Any]]) -> str:
        """The name of the argument that holds the object at ``path`` of ``(args, kwargs)``."""
        if path[0] == 1:
            name = str(list(tree[1])[path[1]])
        else:
            params = list(self._sig.parameters) if self._sig is not None else []
            name = params[path[1]] if path[1] < len(params) else f"#{path[1]}"
        return name if len(path) == 2 else f"{name} (inside)"

    def _extra_key(self) -> tuple[Any, ...]:
        """The module's part of the structure key; recomputed only when the cheap
        :class:`ModuleSnapshot` check says the module may have changed."""
        if self.module is None:
            return ()
        snap = self._snapshot
        if snap is not None and snap.holds():
            return snap.key
        key = self._module_key()
        self._snapshot = ModuleSnapshot(self.module, key)
        return key

    def _module_key(self) -> tuple[Any, ...]:
        assert self.module is not None
        flags = tuple(m.training for m in self.module.modules())
        # the owning dict's identity too: the graph reads parameters through these
        # slots, so a replaced submodule must recompile, not read the old one
        state = tuple(
            (id(owner), key, owner[key].dtype, tuple(owner[key].shape))
            for _, owner, key in module_state(self.module)
        )
        return (flags, state)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast
        if fast is not None:
            out = fast(args, kwargs)
            if out is not fast_path.MISS:
                return out
        art, leaves, hit = self._prepare(args, kwargs)
        out = self._serve(art, leaves, args, kwargs, hit=hit)
        self._fast = fast_path.of(self, art)  # the next call tries this variant first
        return out

    def submit(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call asynchronously: arguments, guards and any compile on this thread, the
        run on the runtime's pool, in submission order per function; returns a
        ``concurrent.futures.Future`` (see :mod:`cuvil.submit`)."""
        art, leaves, hit = self._prepare(args, kwargs)
        return self._queue.submit(functools.partial(self._serve, art, leaves, args, kwargs, hit))

    def _prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Artifact, list[Any], bool]:
        """The artifact for this call (found, or compiled now), its argument leaves, and
        whether it was a cache hit."""
        # Fast path: plain positional tensors, checked and flattened like this before
        # (no containers), reuse the remembered tree spec.
        spec = None if kwargs else self._flat_specs.get(len(args))
        if spec is not None and all(type(a) in PLAIN_TENSORS for a in args):
            leaves: list[Any] = list(args)
            bargs, bkwargs = args, dict[str, Any]()
            objects = False  # plain tensors only
        else:
            bargs, bkwargs = self._check_call(args, kwargs)
            registered: list[Any] = []
            leaves, spec = arg_objects.flatten((bargs, bkwargs), sizes=self.int_sizes, registered=registered)
            if not self.int_sizes and self.dynamic:  # sizes passed as such (the torch.compile backend)
                leaves = [arg_objects.plain(x) for x in leaves]
            if not kwargs and all(type(a) in PLAIN_TENSORS for a in args):
                self._flat_specs[len(args)] = spec
            objects = arg_objects.has_objects(spec)
        key: tuple[Any, ...] = (spec, tuple(leaf_key(x, self.dynamic) for x in leaves))
        if objects:
            # registered objects' state besides their tensors ([Note: objects in the argument tree])
            key += (arg_objects.object_states((bargs, bkwargs), registered),)
        extra = self._extra_key()
        amp = autocast.state(leaves)
        art = self._find(key, extra, amp, leaves, self.artifacts)
        if art is not None:
            return art, leaves, True
        names = self._leaf_names(bargs, bkwargs)
        self._check_types(key, names)
        # One compile per key: threads missing at once queue here, and each looks again
        # at what the ones before it compiled.
        with self._compile_lock:
            art = self._find(key, extra, amp, leaves, self.artifacts)  # with what others just compiled
            if art is not None:
                return art, leaves, True
            if self.artifacts:
                self._note_recompile(self._why_miss(key, extra, amp, leaves, names))
            art = self._compile(key, extra, amp, leaves, names, spec, (bargs, bkwargs))
            # a new list, not an in-place change: other threads may be scanning the old one
            self.artifacts = [*self.artifacts[-(MAX_ARTIFACTS - 1) :], art]
        return art, leaves, False

    def _note_recompile(self, reason: str) -> None:
        reasons = self.stats.recompile_reasons
        reasons.append(reason)
        if len(reasons) > MAX_REASONS:
            del reasons[: len(reasons) - MAX_REASONS]
        if self.stats.compiles == MANY_RECOMPILES and "recompiles" not in self._warned:
            self._warned.add("recompiles")
            warnings.warn(
                f"cuvil: {self.__qualname__} has been compiled {MANY_RECOMPILES} times; the latest "
                f"reason: {reason}. A value that changes on every call (a global, an attribute, "
                "a Python number argument) recompiles every call: pass it as a tensor argument "
                f"instead. At most {MAX_ARTIFACTS} compiled variants are kept.",
                UserWarning,
                stacklevel=4,
            )

    @staticmethod
    def _find(
        key: tuple[Any, ...],
        extra: tuple[Any, ...],
        amp: tuple[Any, ...],
        leaves: list[Any],
        artifacts: list[Artifact],
    ) -> Artifact | None:
        for art in artifacts:
            if (
                art.key == key
                and art.extra == extra
                and art.amp == amp
                and (art.captured is None or art.captured.guards.holds())
                and lifted_ok(art)
                and (art.captured is None or art.captured.check.holds(leaves))
            ):
                return art
        return None

    def _serve(
        self, art: Artifact, leaves: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any], hit: bool
    ) -> Any:
        self._last = art
        if art.captured is None:
            with autocast.entered_again(art.amp):  # autocast is per thread; submit runs on another
                return self._eager(art.reason or "", args, kwargs)
        if hit:
            self.stats.cache_hits += 1
        if art.amp:  # the graph holds autocast's casts ([Note: autocast captured])
            with autocast.switched_off(art.amp):
                return run_artifact(art, leaves, (args, kwargs))
        return run_artifact(art, leaves, (args, kwargs))

    def _check_types(self, key: tuple[Any, ...], names: list[str]) -> None:
        """A non-tensor where a tensor was traced is a caller error, not a recompile."""
        for art in self.artifacts:
            if art.captured is None or art.key[0] != key[0]:
                continue
            for name, old, new in zip(names, art.key[1], key[1]):
                if old[0] == "tensor" and new[0] != "tensor":
                    raise TypeError(
                        f"{self.__qualname__}(): argument {name} must be a torch.Tensor "
                        f"(it was one when this function was compiled), got {new[1].__name__}"
                    )

    def _why_miss(
        self,
        key: tuple[Any, ...],
        extra: tuple[Any, ...],
        amp: tuple[Any, ...],
        leaves: list[Any],
        names: list[str],
    ) -> str:
        # the latest variant of the same structure when there is one: its failed guard is
        # the reason (a structure difference from another variant says less)
        same = [a for a in self.artifacts if a.key == key and a.extra == extra and a.amp == amp]
        alike = [a for a in self.artifacts if a.key[0] == key[0]]  # the same argument structure
        last = (same or alike or self.artifacts)[-1]
        if last.amp != amp:
            return f"autocast changed (was {autocast.describe(last.amp)}, now {autocast.describe(amp)})"
        if last.key[:2] == key[:2] and last.key[2:] != key[2:] and last.extra == extra:
            return _explain_objects(last.key[2:], key[2:])
        if last.key != key or last.extra != extra:
            return explain_structure(names, last.key[1], key[1], last.extra, extra, last.names)
        if last.captured is not None and not last.captured.guards.holds():
            return last.captured.guards.explain()
        if not lifted_ok(last):
            return "a global, closure or attribute tensor the graph reads changed shape or dtype"
        assert last.captured is not None
        return last.captured.check.explain(leaves)

    def _compile(
        self,
        key: tuple[Any, ...],
        extra: tuple[Any, ...],
        amp: tuple[Any, ...],
        leaves: list[Any],
        names: list[str],
        spec: Any,
        tree: tuple[tuple[Any, ...], dict[str, Any]],
    ) -> Artifact:
        self.stats.compiles += 1
        target_name = self.target
        paused = False
        try:
            target_name = self._pick_target(leaves)
            from cuvil_runtime.registry import get_target

            target = get_target(target_name)
            # before capture: an unsupported tensor must not reach tracing or kernels
            check_tensors(leaves, names, target.capabilities.devices, target_name)
            if self.module is not None:
                check_module_state(self.module)
            if autocast.uncaptured(amp):  # before a warm start too: it could not be reproduced
                raise autocast.at_call(autocast.uncaptured(amp))
            check_options(dict(self.options), target.capabilities, target_name)
            if self.module is not None and torch.is_grad_enabled():
                self._warn_parameters_need_no_grad()
            if len(key) > 2:  # the function runs on rebuilt objects: they must equal the caller's
                arg_objects.check_round_trip(tree, lambda path: self._arg_name(path, tree))
            options = CompileOptions(opt_level=self.opt_level, extra=self.options)
            # a variant another process captured, when all it read is as it was (cuvil/warm.py)
            wkey = warm.key(self, key, target, options, amp) if warm.enabled() else None
            captured = None
            if wkey is not None:
                gc_pause.pause()  # until the program is loaded: [Note: warm starts pause the collector]
                paused = True
                captured = warm.lookup(self, wkey, leaves)
            if captured is not None:
                self.stats.warm_starts += 1
            else:
                if paused:  # a capture and compile from scratch: not paused
                    paused = False
                    gc_pause.resume()
                try:
                    captured = capture(
                        self.__name__, self.fn, self.module, leaves, names, spec, self.dynamic, self.dims
                    )
                except CompileError as e:
                    if not any(type(x) is arg_objects.SizeArg for x in leaves):
                        raise
                    # code an int attribute as a size cannot run (a Python loop over it that
                    # appends to a list): ints are values from now on, as before
                    # [Note: int attributes are sizes]; this call is captured again
                    self.int_sizes = False
                    self.stats.notes.append(
                        "int attributes of arguments are specialized by value from now on: capturing "
                        f"with them as size symbols failed: {e.reason}"
                    )
                    leaves = [arg_objects.plain(x) for x in leaves]
                    key = (key[0], tuple(leaf_key(x, self.dynamic) for x in leaves), *key[2:])
                    wkey = warm.key(self, key, target, options, amp) if warm.enabled() else None
                    captured = capture(
                        self.__name__, self.fn, self.module, leaves, names, spec, self.dynamic, self.dims
                    )
                why = None
                if wkey is not None:
                    why = warm.store(self, wkey, captured, leaves, key)
                elif warm.enabled() and arg_objects.has_objects(spec):
                    why = (
                        "the call passes Python objects (a cache, an options object) whose state "
                        "and identity belong to this process"
                    )
                if why is not None and f"not stored for warm starts: {why}" not in self.stats.notes:
                    self.stats.notes.append(f"not stored for warm starts: {why}")
            check_capabilities(captured.graph, target.capabilities, target_name)
            executable = _EXECUTABLES.get_or_compile(captured.graph, target, options)
            for note in getattr(executable, "notes", ()):
                if note not in self.stats.notes:
                    self.stats.notes.append(note)
        except (OptionError, TargetMisconfiguredError):  # the user's own setting: never hidden by a fallback
            raise
        except Exception as e:
            if isinstance(e, CompileError):
                reason = e.reason
            elif isinstance(e, TargetError):
                reason = f"target {target_name!r}: {e}"
            else:
                reason = f"internal error: {type(e).__name__}: {e}"
            if self.fallback == "error":
                if isinstance(e, CompileError):
                    raise
                raise CompileError(reason) from e
            return Artifact(key, extra, None, None, None, reason, names=tuple(names), amp=amp)
        finally:
            if paused:
                gc_pause.resume()
        return Artifact(
            key,
            extra,
            captured,
            executable,
            target_name,
            lifted_keys=lifted_keys(captured),
            names=tuple(names),
            amp=amp,
        )

    def _warn_parameters_need_no_grad(self) -> None:
        assert self.module is not None
        grad = [n for n, p in self.module.named_parameters() if p.requires_grad]
        if grad and "parameters" not in self._warned:
            self._warned.add("parameters")
            warnings.warn(
                f"cuvil: {self.__qualname__} has parameters that require grad ({grad[0]}, ...) and grad "
                "mode is on, but compiled results carry no autograd history (Cuvil compiles "
                "inference). Call it under torch.no_grad() or torch.inference_mode(), or "
                "requires_grad_(False) the module, to silence this.",
                UserWarning,
                stacklevel=4,
            )

    def _pick_target(self, leaves: list[Any]) -> str:
        if self.opt_level == 0:
            return "reference"
        if self.target is not None:
            return self.target
        from cuvil_runtime.registry import default_target

        devices = [x.device.type for x in leaves if isinstance(x, torch.Tensor)]
        return default_target(devices[0] if devices else "cpu")

    def _eager(self, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.stats.fallbacks += 1
        self.stats.fallback_reasons.append(reason)
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(
                f"cuvil: running {self.__qualname__} eagerly: {reason}", CuvilFallbackWarning, stacklevel=3
            )
        return self.fn(*args, **kwargs)


# one called from compiled code is inlined (hooks cannot import this module: a cycle)
hooks.COMPILED_FUNCTION = (CompiledFunction,)


def _explain_objects(old: tuple[Any, ...], new: tuple[Any, ...]) -> str:
    for a, b in zip(old[0], new[0]):
        for (where, was), (_, now) in zip(a, b):
            if was != now:
                return f"argument object {where}: was {was[-1]!r}, now {now[-1]!r}"
    return "an argument object changed structure"


def _routed(compiled: CompiledFunction, module: torch.nn.Module, method: types.MethodType) -> Any:
    """A method of the compiled module's own classes (``generate``, not ``nn.Module``'s)
    run so that its calls of the module (``self(...)``) are compiled calls.

    [Note: methods of a compiled module] The method runs on a view of the module: a
    shallow copy (the same parameters, buffers, submodules and hooks) whose ``forward``
    is the compiled function, so the caller's module is never changed and an eager
    ``model(x)`` stays eager. Plain attributes the method assigns on ``self`` (a cache
    it keeps for the next call) are assigned on the module when it returns."""

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        view = copy.copy(module)
        object.__setattr__(view, "forward", compiled)
        before = dict(vars(view))
        try:
            return method.__func__(view, *args, **kwargs)
        finally:
            for k, v in vars(view).items():
                if k != "forward" and before.get(k, _ABSENT) is not v:
                    object.__setattr__(module, k, v)

    return run


_ABSENT = object()


def compile(
    fn_or_module: Any = None,
    *,
    target: str | None = None,
    opt_level: int = 2,
    dynamic: bool = True,
    fallback: str = "eager",
    dims: dict[str, dict[int, str | None]] | None = None,
    **options: Any,
) -> Any:
    """Compile a function or ``nn.Module`` for inference; usable bare or with arguments.

    ``target=None`` picks the best available target for the inputs' device;
    ``opt_level=0`` runs the reference target (op by op, eager torch);
    ``dynamic=True`` makes every input size symbolic (one artifact for all
    shapes that satisfy the graph's size guards); ``fallback="eager"`` runs the
    original code (with a warning, counted in ``stats``) when compiling fails,
    ``"error"`` raises :class:`CompileError` instead. ``dims`` names sizes
    (``{"x": {0: "B"}, "y": {0: "B"}}``): one name is one symbol, so those sizes
    are known equal (a call where they differ is refused by the guards); ``None``
    for a name keeps that size static under ``dynamic=True`` (a constant in the
    graph, guarded: another value recompiles). Other
    keywords are the target's own options (``cuda_graphs=False`` on ``cuda``; each
    target lists its options in ``Capabilities.options``): one the target does not
    take is a ``TypeError``.
    """

    def wrap(f: Any) -> CompiledFunction:
        if not callable(f):
            raise TypeError(f"cuvil.compile expects a function or nn.Module, got {type(f).__name__}")
        return CompiledFunction(
            f,
            target=target,
            opt_level=opt_level,
            dynamic=dynamic,
            fallback=fallback,
            dims=dims,
            options=options,
        )

    if fn_or_module is None:
        return wrap
    return wrap(fn_or_module)
