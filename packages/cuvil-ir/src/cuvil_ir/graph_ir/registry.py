"""The op registry: every Graph IR op is declared once, as a subclass of :class:`Op`.

A declaration puts side by side everything later levels need to know about an op:

- ``name``: the op's name in IR text;
- ``traits``: data for passes and backends (``"elementwise"``, ``"reduction"``,
  ``"view"``, ``"opaque"`` ...), never a name to branch on;
- ``infer(ctx, *input_types, **attrs)``: the symbolic shape/dtype rule; its
  keyword-only parameters *are* the op's attribute schema;
- ``reference(*inputs, **attrs)``: the eager torch call the reference executor
  runs (attributes arrive with every size expression already evaluated);
- ``scalar``: for an elementwise op that is one scalar function of its operands'
  elements, that function's name in Tensor IR (``"exp"``, ``"max"`` for ``maximum``);
- ``torch``: a callable returning the torch callables this op captures, and
  ``capture(b, *args, **kwargs)``: turns one such torch call into IR by calling
  ``b.emit(...)`` (see :class:`Emitter`). Raising :class:`NotCaptured` makes the
  frontend fall back to an ``extern`` node, which is always correct.

Third-party operator libraries declare ops the same way, in a module named by a
``cuvil.ops`` entry point (or with ``cu.custom_op``, a composite op whose
decomposition is captured from a torch reference: :mod:`cuvil_ir.graph_ir.ops.composite`).
A plugin module that fails to import (a bug in it, an op name another distribution
already declared) is recorded with its error (:meth:`Registry.plugin_errors`) and
never breaks the other plugins.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from cuvil_ir.graph_ir.types import Type
from cuvil_ir.symbolic import ShapeContext


class NotCaptured(Exception):
    """A capture rule declines this call; the frontend records an extern node."""


class Emitter(Protocol):
    """What capture rules may ask of the frontend while recording a call.

    Values are opaque handles (proxies); sizes arrive as ``int`` or sympy exprs.
    """

    ctx: ShapeContext

    def emit(self, op: str, inputs: Sequence[Any], **attrs: Any) -> Any:
        """Record ``op`` applied to ``inputs``; returns the output handle(s)."""

    def type_of(self, value: Any) -> Type:
        """The IR type of a handle, or of a Python scalar (a weak scalar type)."""

    def is_value(self, value: Any) -> bool:
        """True for tensor/scalar handles of the trace (not Python constants)."""

    def rebind(self, target: Any, result: Any) -> Any:
        """In-place semantics: ``target`` now holds ``result``; returns ``target``."""


CaptureRule = Callable[..., Any]


def _no_torch() -> tuple[()]:
    return ()


def _no_capture(b: Emitter, *args: Any, **kwargs: Any) -> Any:
    raise NotCaptured("no capture rule")


def registrar(table: dict[str, Any]) -> Callable[..., Callable[[Any], Any]]:
    """A decorator factory filling ``table``: ``@reg("add", "sub") def f(...)`` maps both
    op names to ``f`` (the lowering, emission and ONNX tables are all keyed by op name)."""

    def reg(*names: str) -> Callable[[Any], Any]:
        def deco(fn: Any) -> Any:
            for n in names:
                table[n] = fn
            return fn

        return deco

    return reg


class Op:
    """Base of op declarations; subclasses define the class attributes below
    (``infer`` and ``reference`` as staticmethods), and register on definition."""

    name: ClassVar[str]
    traits: ClassVar[frozenset[str]] = frozenset()
    attr_names: ClassVar[tuple[str, ...]] = ()
    #: the attributes every node of the op carries (those of ``infer`` without a default)
    required_attrs: ClassVar[tuple[str, ...]] = ()
    #: number of outputs when fixed; ``None`` when an attribute decides it
    num_outputs: ClassVar[int | None] = 1

    #: the torch callables this op captures; a ``(callable, rule)`` pair overrides
    #: :attr:`capture` for that callable (e.g. reflected operators)
    torch: ClassVar[Callable[[], Iterable[Callable[..., Any] | tuple[Callable[..., Any], CaptureRule]]]]
    #: ``capture(b, *torch_args, **torch_kwargs)``: record one torch call through ``b``
    capture: ClassVar[CaptureRule]
    #: ``infer(ctx, *input_types, **attrs)``: the symbolic shape/dtype rule
    infer: ClassVar[Callable[..., Type | tuple[Type, ...]]]
    #: ``reference(*inputs, **attrs)``: the eager torch implementation
    reference: ClassVar[Callable[..., Any]]
    #: ``check_regions(node, checker)``: verifies the regions and result types of an op
    #: that carries regions (see :class:`cuvil_ir.graph_ir.verifier.RegionChecker`)
    check_regions: ClassVar[Callable[..., None] | None] = None
    #: ``decompose(b, *inputs, **attrs)``: the op written once in other (primitive) ops
    #: with a :class:`~cuvil_ir.graph_ir.decompose.Builder`. Tensor IR lowering, MLIR
    #: emission and ONNX export use it wherever they have no native form of the op
    decompose: ClassVar[Callable[..., Any] | None] = None
    #: consumer (``"tensor_ir"``, ``"mlir"``, ``"onnx"``) -> why it does not lower this op
    #: itself (Tensor IR and MLIR then call the op's reference as an extern, ONNX export
    #: refuses it), even where a decomposition exists; data the coverage tests read
    extern_reasons: ClassVar[Mapping[str, str]] = {}
    #: the Tensor IR scalar function (a name of :data:`cuvil_ir.tensor_ir.expr.FUNCTIONS`)
    #: this elementwise op computes of its operands' elements, one argument per operand:
    #: Tensor IR lowering derives the op's rule from it (:mod:`cuvil_ir.tensor_ir.rules`)
    #: unless a rule is written out for the op; ``None``: no single function
    scalar: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return  # an abstract family base
        sig = inspect.signature(cls.infer)
        if "torch" not in cls.__dict__ and not hasattr(cls, "torch"):
            cls.torch = _no_torch
        if not hasattr(cls, "capture"):
            cls.capture = _no_capture
        keyword = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        cls.attr_names = tuple(p.name for p in keyword)
        # a keyword with a default is an attribute a node may leave out (its text then
        # has none): how an op gains an attribute without changing every graph's text
        cls.required_attrs = tuple(p.name for p in keyword if p.default is inspect.Parameter.empty)
        cls.traits = frozenset(cls.traits)
        REGISTRY.add(cls)


class Registry:
    """Name → op, and torch callable → op (for capture)."""

    def __init__(self) -> None:
        self._ops: dict[str, type[Op]] = {}
        self._origin: dict[str, str] = {}
        self._by_torch: dict[Any, tuple[type[Op], CaptureRule]] | None = None
        self._plugins_loaded = False
        #: (distribution, entry-point name, value) of every ``cuvil.ops`` entry imported or tried
        self._loaded: set[tuple[str, str, str]] = set()
        #: entry-point name -> (distribution, the error its import raised)
        self._errors: dict[str, tuple[str, str]] = {}

    def add(self, op: type[Op]) -> None:
        origin = op.__module__
        if op.name in self._ops:
            raise ValueError(
                f"op {op.name!r} is declared twice: by {describe_origin(self._origin[op.name])} and by "
                f"{describe_origin(origin)}; uninstall or rename one of them"
            )
        self._ops[op.name] = op
        self._origin[op.name] = origin
        self._by_torch = None

    def remove(self, name: str, *, origin: str) -> None:
        """Forget op ``name``, declared in module ``origin`` (a declaration made again)."""
        if self._origin.get(name) != origin:
            raise ValueError(
                f"op {name!r} is declared by {describe_origin(self._origin.get(name, '?'))}, "
                f"not by module {origin}: it cannot be replaced from there"
            )
        del self._ops[name], self._origin[name]
        self._by_torch = None

    def origin(self, name: str) -> str:
        """The module that declared op ``name``."""
        return self._origin[name]

    def plugin_errors(self) -> dict[str, tuple[str, str]]:
        """``cuvil.ops`` entry points whose import failed: name -> (distribution, error)."""
        self.load_plugins()
        return dict(self._errors)

    def get(self, name: str) -> type[Op]:
        try:
            return self._ops[name]
        except KeyError:
            self.load_plugins()
            if name in self._ops:
                return self._ops[name]
            raise KeyError(f"unknown Graph IR op {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def for_torch(self, fn: Any) -> tuple[type[Op], CaptureRule] | None:
        """The op and capture rule that handle the torch callable ``fn``."""
        if self._by_torch is None:
            self.load_plugins()
            table: dict[Any, tuple[type[Op], CaptureRule]] = {}
            for op in sorted(self._ops.values(), key=lambda o: o.name):
                for entry in op.torch():
                    t, rule = entry if isinstance(entry, tuple) else (entry, op.capture)
                    # a builtin the frontend wraps while it captures is keyed as itself
                    # (cuvil/frontend/builtin_args.py)
                    t = getattr(t, "__dict__", {}).get("__cuvil_wrapped__", t)
                    if t in table and table[t][0] is not op:
                        raise ValueError(f"{t} is captured by both {table[t][0].name!r} and {op.name!r}")
                    table[t] = (op, rule)
            self._by_torch = table
        try:
            return self._by_torch.get(fn)
        except TypeError:  # unhashable callable
            return None

    def load_plugins(self, *, rescan: bool = False) -> None:
        """Import the modules named by ``cuvil.ops`` entry points (once; ``rescan``: also
        those of distributions installed since, and those that failed before). One that
        raises is recorded in :meth:`plugin_errors` with its distribution, and the others
        still load."""
        if self._plugins_loaded and not rescan:
            return
        if rescan:
            _installed_packages.cache_clear()  # distributions installed since
        with _LOAD_LOCK:
            if self._plugins_loaded and not rescan:
                return
            from importlib.metadata import entry_points

            for ep in sorted(entry_points(group="cuvil.ops"), key=lambda e: e.name):
                dist = ep.dist.name if ep.dist is not None else "<unknown distribution>"
                key = (dist, ep.name, ep.value)
                failed = ep.name in self._errors
                if key in self._loaded and not (rescan and failed):
                    continue  # loaded, or failed and not asked to try again
                self._loaded.add(key)
                try:
                    ep.load()
                except Exception as e:  # reported by `cuvil ops`; the other plugins load
                    self._errors[ep.name] = (dist, f"{type(e).__name__}: {e}")
                else:
                    self._errors.pop(ep.name, None)
            self._plugins_loaded = True
            self._by_torch = None


#: Every op declared. The built-in ops (:mod:`cuvil_ir.graph_ir.ops`) register when the
#: package ``cuvil_ir.graph_ir`` is imported, which Python does before this module is
#: (not imported from here: each op family imports this module); plugin ops on first
#: lookup (:meth:`Registry.load_plugins`).
REGISTRY = Registry()

_LOAD_LOCK = threading.RLock()  # re-entrant: a plugin's import may ask the registry again


def distribution_of(module: str) -> str | None:
    """The installed distribution that provides the top-level package of ``module``:
    from the installed files, else (an editable install lists none) a distribution
    whose ``cuvil.*`` entry points name that package, else one named after it."""
    from importlib.metadata import PackageNotFoundError, distribution

    top = module.split(".", 1)[0]
    found = _installed_packages().get(top)
    if found is not None:
        return found
    try:
        return str(distribution(top.replace("_", "-")).metadata["Name"])
    except PackageNotFoundError:
        return None


@functools.cache
def _installed_packages() -> dict[str, str]:
    """Top-level package -> distribution, read once (every distribution's files and
    entry points: a scan of site-packages); :meth:`Registry.load_plugins` with
    ``rescan`` reads it again."""
    from importlib.metadata import entry_points, packages_distributions

    out: dict[str, str] = {}
    for group in ("cuvil.ops", "cuvil.backends"):
        for ep in entry_points(group=group):
            if ep.dist is not None:
                out.setdefault(ep.module.split(".", 1)[0], str(ep.dist.name))
    for top, names in packages_distributions().items():
        if names:
            out[top] = names[0]
    return out


def describe_origin(module: str) -> str:
    """``distribution 'x' (module m)``, or ``module m`` when no distribution provides it."""
    dist = distribution_of(module)
    return f"distribution {dist!r} (module {module})" if dist else f"module {module}"


def infer_types(
    op: type[Op], ctx: ShapeContext, inputs: Sequence[Type], attrs: dict[str, Any]
) -> tuple[Type, ...]:
    out = op.infer(ctx, *inputs, **attrs)
    return out if isinstance(out, tuple) else (out,)
