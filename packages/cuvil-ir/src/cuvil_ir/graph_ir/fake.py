"""Output types of arbitrary torch calls, from torch's own fake/meta kernels.

This is how ``extern`` nodes get symbolic output types: our size symbols are
mirrored into a torch ``ShapeEnv`` (no duck sizing, no 0/1 specialisation),
fake tensors with those symbolic sizes are built, the torch callable runs under
``FakeTensorMode``, and the symbolic sizes of the results are mapped back. Any
size fact torch had to assume (its guards) becomes an assumption of our graph.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Ref
from cuvil_ir.graph_ir.types import DType, ScalarKind, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError, as_dim, symbol


class FakeInferenceError(Exception):
    """torch could not compute the output type symbolically."""


def _source_class() -> type:
    from torch._guards import GuardSource, Source

    @dataclasses.dataclass(frozen=True)
    class SymbolSource(Source):
        label: str = ""

        @property
        def _name_template(self) -> str:
            return self.label

        @property
        def guard_source(self) -> GuardSource:
            return GuardSource.LOCAL

    return SymbolSource


_SOURCE: Any = None


def materialize(value: AttrValue, refs: Sequence[Any], size: Callable[[Any], Any] | None = None) -> Any:
    """Turn an attribute tree with :class:`Ref` placeholders into call arguments.

    ``size`` converts size expressions (the executor evaluates them before this).
    """
    if isinstance(value, Ref):
        return refs[value.index]
    if isinstance(value, KV):
        if value.items and value.items[0][0] == "__slice__":
            return slice(*materialize(value.items[0][1], refs, size))
        if value.items and value.items[0][0] == "__ellipsis__":
            return Ellipsis
        if value.items and value.items[0][0] == "__list__":  # a list in an index key
            return list(materialize(value.items[0][1], refs, size))
        if value.items and value.items[0][0] == "__memory_format__":
            import torch

            fmt = getattr(torch, str(value.items[0][1]), None)
            if not isinstance(fmt, torch.memory_format):
                raise ValueError(f"not a memory format: {value.items[0][1]!r}")
            return fmt
        return {k: materialize(v, refs, size) for k, v in value.items}
    if isinstance(value, tuple):
        return tuple(materialize(v, refs, size) for v in value)
    if isinstance(value, DType):
        return value.torch
    if size is not None and isinstance(value, sympy.Basic):
        return size(value)
    return value


def _plain_sympy(expr: Any) -> Any:
    """Rewrite torch's private sympy functions (FloorDiv, PythonMod ...) into plain sympy.

    Our IR text and guards use only functions :func:`cuvil_ir.symbolic.parse_expr`
    knows; anything else makes the fact unusable, which is reported, not dropped.
    """
    import torch.utils._sympy.functions as tf

    floor_div = lambda a, b: sympy.floor(a / b)  # noqa: E731
    table: list[tuple[Any, Any]] = [
        (tf.FloorDiv, floor_div),
        (tf.CleanDiv, floor_div),
        (tf.CeilDiv, lambda a, b: sympy.ceiling(a / b)),
        (tf.IntTrueDiv, lambda a, b: a / b),
        (tf.ModularIndexing, lambda a, b, c: sympy.Mod(sympy.floor(a / b), c)),
        (tf.PythonMod, sympy.Mod),
        (tf.Mod, sympy.Mod),
        (tf.PowByNatural, lambda a, b: a**b),
        (tf.Max, sympy.Max),
        (tf.Min, sympy.Min),
        (tf.FloorToInt, sympy.floor),
        (tf.CeilToInt, sympy.ceiling),
        # written with functions our parser reads back (it has no `sign`)
        (tf.TruncToInt, lambda a: sympy.Piecewise((sympy.floor(a), a >= 0), (sympy.ceiling(a), True))),
        (tf.ToFloat, lambda a: a),
        (tf.FloatPow, lambda a, b: a**b),
        (tf.FloatTrueDiv, lambda a, b: a / b),
        (tf.OpaqueUnaryFn_sqrt, sympy.sqrt),
        (tf.Identity, lambda a: a),
    ]
    for cls, fn in table:
        if expr.has(cls):
            expr = expr.replace(cls, fn)
    allowed = (
        sympy.floor,
        sympy.ceiling,
        sympy.Mod,
        sympy.Max,
        sympy.Min,
        sympy.Abs,
        sympy.Piecewise,
    )
    for f in expr.atoms(sympy.Function):
        if not isinstance(f, allowed):
            raise FakeInferenceError(f"cannot represent the size expression {expr} (uses {type(f).__name__})")
    return expr


def _torch_sympy(expr: Any) -> Any:
    """Our integer divisions in torch's terms: ``floor(p/q)`` -> ``FloorDiv(p, q)``,
    ``ceiling(p/q)`` -> ``CeilDiv(p, q)``, ``Mod`` -> ``PythonMod`` (the inverse of
    :func:`_plain_sympy`). torch's value-range analysis cannot take a size with a
    negative power (``s11*s5/s59``) and failed with "Exponent must be non-negative"."""
    import torch.utils._sympy.functions as tf

    def division(f: Any, div: Any) -> Any:
        p, q = sympy.fraction(sympy.together(f.args[0]))
        if q == 1 or not (p.is_integer and q.is_integer):
            return None
        return div(p, q)

    def rewrite(e: Any) -> Any:
        if not isinstance(e, sympy.Basic) or e.is_Atom:
            return e
        e = e.func(*(rewrite(a) for a in e.args)) if e.args else e
        if isinstance(e, sympy.floor):
            return division(e, tf.FloorDiv) or e
        if isinstance(e, sympy.ceiling):
            return division(e, tf.CeilDiv) or e
        if isinstance(e, sympy.Mod) and all(a.is_integer for a in e.args):
            return tf.PythonMod(*e.args)
        return e

    if not expr.has(sympy.floor, sympy.ceiling, sympy.Mod):
        return expr
    return rewrite(expr)


def _is_unbacked(s: sympy.Symbol) -> bool:
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return bool(symbol_is_type(s, SymT.UNBACKED_INT))


class SymMirror:
    """Our size symbols mirrored into one torch ``ShapeEnv`` (no duck sizing, no
    0/1 specialisation), so torch code -- fake kernels, and user code holding
    ``torch.SymInt`` sizes -- computes with them. Facts torch decides (its guards)
    flow back into the :class:`ShapeContext` through :meth:`sync`.
    """

    def __init__(self, ctx: ShapeContext) -> None:
        global _SOURCE
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        if ctx.hints is None:
            raise UndecidableError("torch symbolic sizes need example sizes")
        if _SOURCE is None:
            _SOURCE = _source_class()
        self.ctx = ctx
        self.env = ShapeEnv(specialize_zero_one=False, duck_shape=False, assume_static_by_default=False)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=False)
        self.ours_to_theirs: dict[sympy.Symbol, sympy.Expr] = {}
        self.theirs_to_ours: dict[sympy.Symbol, sympy.Symbol] = {}
        self._synced = 0
        #: our data-dependent size symbols (see [Note: data-dependent sizes] in
        #: cuvil_ir.graph_ir.ops.core), in the order they were made
        self.unbacked: list[sympy.Symbol] = []
        #: facts about them torch needed, not yet taken by :meth:`runtime_asserts`
        self._asserts: list[sympy.Basic] = []
        self._asserts_seen: set[Any] = set()

    #: the ShapeEnv's state that facts change (see :meth:`branch`)
    _BRANCH_STATE = (
        "replacements",
        "replacements_slocs",
        "var_to_range",
        "var_to_range_sloc",
        "divisible",
        "axioms",  # what torch derived from its guards: it decides statically from them
    )

    def checkpoint(self) -> tuple[int, dict[str, Any]]:
        """What :meth:`restore` puts back: the guards so far and the facts torch applies."""
        env = self.env
        return len(env.guards), {n: copy.copy(getattr(env, n)) for n in self._BRANCH_STATE if hasattr(env, n)}

    def restore(self, saved: tuple[int, dict[str, Any]]) -> None:
        """Forget what torch learnt since :meth:`checkpoint` (an attempt that failed)."""
        count, state = saved
        del self.env.guards[max(count, self._synced) :]
        self._put_back(state)

    def _put_back(self, saved: dict[str, Any]) -> None:
        env = self.env
        # symbols first mirrored since keep what torch knows of them (their ranges);
        # what it learnt about the symbols from before is undone
        new = set(getattr(env, "var_to_range", {})) - set(saved.get("var_to_range", {}))
        for name, old in saved.items():
            now = getattr(env, name)
            if isinstance(old, dict):
                old.update({k: v for k, v in now.items() if k in new})
            elif isinstance(old, set):
                old.update(e for e in now if getattr(e, "free_symbols", set()) <= new)
            setattr(env, name, old)
        bump = getattr(env, "_update_version_counter", None)
        if bump is not None:
            bump()  # the ShapeEnv's caches key on it

    @contextlib.contextmanager
    def branch(self) -> Iterator[None]:
        """Trace one branch of an ``if``: what torch learns there stays there.

        torch's ShapeEnv applies a fact it learns everywhere: ``Eq(s, 1)`` learnt in
        one branch replaces ``s`` by 1 from then on, so a size computed after the
        ``if`` (``Piecewise((s, c), (1, True))``) became the constant 1, unguarded.
        Our :class:`ShapeContext` records branch facts conditionally (``path``); here
        the ShapeEnv's replacements, ranges and divisibility are put back as they were
        before the branch. The caller syncs the branch's guards before leaving it.
        """
        _, saved = self.checkpoint()
        try:
            yield
        finally:
            self._put_back(saved)

    def _add(self, s: sympy.Symbol) -> None:
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        theirs = self.env.create_symbol(
            self.ctx.hint(s),
            _SOURCE(label=s.name),
            dynamic_dim=DimDynamic.DYNAMIC,
            positive=None,
            do_not_specialize_zero_one=True,
        )
        self.ours_to_theirs[s] = theirs
        if isinstance(theirs, sympy.Symbol):
            self.theirs_to_ours[theirs] = s

    def symint(self, d: Dim | sympy.Basic) -> Any:
        """A ``torch.SymInt`` for a size expression (an int stays an int)."""
        if isinstance(d, int):
            return d
        for s in sorted(d.free_symbols - set(self.ours_to_theirs), key=lambda x: x.name):
            self._add(s)
        theirs = _torch_sympy(d.xreplace(self.ours_to_theirs))
        if d.is_Relational or isinstance(d, sympy.logic.boolalg.BooleanFunction):
            return self.env.create_symboolnode(theirs)
        # a data-dependent size has no example value
        hint = None if d.free_symbols & set(self.unbacked) else self.ctx.hint(d)
        return self.env.create_symintnode(theirs, hint=hint)

    def new_size(self) -> tuple[sympy.Symbol, Any]:
        """A fresh data-dependent size: our symbol and the ``torch.SymInt`` for it."""
        import torch

        value = self.env.create_unbacked_symint()
        torch._check(value >= 0)  # type: ignore[no-untyped-call]  # a size, as torch's own data-dependent kernels say
        return self._adopt(value.node.expr), value

    def _adopt(self, theirs: sympy.Symbol) -> sympy.Symbol:
        """Our symbol for torch's data-dependent size ``theirs`` (``u<n>``, numbered in
        the order met, so a trace names them alike every time)."""
        ours = self.theirs_to_ours.get(theirs)
        if ours is None:
            taken = set(self.ours_to_theirs) | set(self.ctx.hints or ())
            n = len(self.unbacked)
            while symbol(f"u{n}") in taken:
                n += 1
            ours = symbol(f"u{n}")
            self.unbacked.append(ours)
            self.ours_to_theirs[ours] = theirs
            self.theirs_to_ours[theirs] = ours
        return ours

    def runtime_asserts(self) -> list[sympy.Basic]:
        """Facts about data-dependent sizes torch needed since the last call (its deferred
        runtime asserts, ``3 <= u0`` for ``topk(x[m], 3)``), in our symbols: the caller
        checks them when the compiled code runs."""
        for facts in list(self.env.deferred_runtime_asserts.values()):
            for ra in facts:
                if id(ra) not in self._asserts_seen:
                    self._asserts_seen.add(id(ra))
                    self._keep_assert(ra.expr)
        out, self._asserts = self._asserts, []
        return out

    def _keep_assert(self, theirs: Any) -> None:
        for s in theirs.free_symbols:
            if s not in self.theirs_to_ours and _is_unbacked(s):
                self._adopt(s)
        fact = _plain_sympy(theirs).xreplace(self.theirs_to_ours)
        if not fact.free_symbols - set(self.ours_to_theirs):
            self._asserts.append(fact)

    def ours(self, value: Any, what: str = "") -> Any:
        """Our sympy expression for a ``torch.SymInt``/``SymBool``/``SymFloat`` (or plain value)."""
        import torch

        if not isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            return value
        raw = self.env.replace(value.node.expr)
        for s in sorted(raw.free_symbols, key=str):
            if s not in self.theirs_to_ours and _is_unbacked(s):
                self._adopt(s)
        expr = _plain_sympy(raw).xreplace(self.theirs_to_ours)
        stray = {s for s in expr.free_symbols if s not in self.ours_to_theirs}
        if stray:
            raise FakeInferenceError(f"{what}: the size depends on tensor data ({value.node.expr})")
        if isinstance(value, torch.SymInt):
            return as_dim(expr)
        return expr

    def sync(self, reason: str = "") -> None:
        """Import the facts torch assumed since the last sync as graph assumptions."""
        guards = self.env.guards
        for guard in guards[self._synced :]:
            fact = _plain_sympy(guard.expr).xreplace(self.theirs_to_ours)
            if fact.free_symbols - set(self.ours_to_theirs):
                continue
            if fact.free_symbols & set(self.unbacked):
                self._asserts.append(fact)  # not a guard: checked when the code runs
                continue
            self.ctx.assume(fact, reason)
        self._synced = len(guards)

    def fake_tensor(self, t: TensorType) -> Any:
        import torch

        sizes = [self.symint(d) for d in t.shape]
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.append(acc)
            acc = acc * s
        with self.mode:
            return torch.empty_strided(sizes, list(reversed(strides)), dtype=t.dtype.torch, device=t.device)


@contextlib.contextmanager
def _quiet_meta_log() -> Iterator[None]:
    """FakeTensorMode logs every failing meta kernel with its stack trace at ERROR level;
    the failure reaches the user as a located CompileError instead."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


#: the torch calls whose implementations run with torch's general path for sizes (see
#: the note), when every index in their key is a tensor or takes whole dims
GENERAL_PATH_CALLS = frozenset({"torch.Tensor.__getitem__", "torch.Tensor.__setitem__"})


def general_path_applies(what: str, args: Sequence[Any], refs: Sequence[Any], mutates: int | None) -> bool:
    """Whether ``what(*args)`` may run torch's general path ([Note: torch's general path
    for sizes]): an in-place call, or advanced indexing."""
    if mutates is not None:
        return True
    if what not in GENERAL_PATH_CALLS or len(args) < 2:
        return False
    key = args[1] if isinstance(args[1], tuple) else (args[1],)
    whole = (KV((("__slice__", (None, None, None)),)), KV((("__ellipsis__", None),)), None)
    tensors = [k for k in key if isinstance(k, Ref) and isinstance(refs[k.index], _tensor_type())]
    return bool(tensors) and all(k in tensors or k in whole for k in key)


def _tensor_type() -> type:
    import torch

    return torch.Tensor


def _index_put_form(x: Any, key: Any, value: Any) -> None:
    """``x[key] = value`` for a key of whole dims and index tensors, as the ``index_put_``
    it is: ``Tensor.__setitem__``'s C++ code also strips leading size-1 dims off
    ``value`` before broadcasting it, guarding each (``Eq(b, 1)`` for a cache's batch)."""
    import torch

    items = key if isinstance(key, tuple) else (key,)
    if not isinstance(value, torch.Tensor) or any(k is None or k is Ellipsis for k in items):
        x[key] = value
        return
    torch.ops.aten.index_put_(x, [None if isinstance(k, slice) else k for k in items], value)


@contextlib.contextmanager
def general_path() -> Iterator[None]:
    """torch's own code takes its general path where a size only might be 1.

    [Note: torch's general path for sizes]
    Advanced indexing broadcasts its index tensors (``meta_index_Tensor`` through
    ``torch._refs._broadcast_shapes``), and transformers' padding mask indexes with a
    batch index of shape ``(b, 1, 1, 1)`` (``padding_mask[batch_idx, kv_idx]``).
    ``_broadcast_shapes`` asks ``guard_or_false(s == 1)`` of each dim; with backed sizes
    that is answered from the example and guarded, so batch 1 was guarded ``Eq(b, 1)``
    and every other batch ``Ne(b, 1)``: two variants of one program. Under torch's
    ``backed_size_oblivious`` setting such a question gets its default answer instead,
    and ``_broadcast_shapes`` is written for that: it takes the non-broadcasting path
    and adds ``torch._check(a == b)``, which on our sizes is a guard read back by
    :meth:`SymMirror.sync` (one where the example needs it: ``torch._check(s == 1)``
    when only one side is 1). So advanced indexing -- a ``__getitem__``/``__setitem__``
    whose key is index tensors and whole dims (``:``, ``None``, ``...``), the calls of
    :data:`GENERAL_PATH_CALLS` -- runs with that setting: no guard for "might be 1",
    one program for batch 1 and batch 8. So does every call that updates its target in
    place (``copy_``, ``index_copy_``, a static cache's writes): its result is its target,
    of the target's type whatever torch answers, and what torch checks there (does the
    source broadcast to the target) torch's own kernel checks again when the call runs.
    Not everything: other kernels answer the same
    question without a check where the answer changes the result (``squeeze`` keeps a
    dim that might be 1, and eager squeezes it), and a partial slice makes a size torch
    cannot bound. If the general path raises for the example's sizes (a real
    broadcast of a size-1 index), the call runs again the example's way, with what
    torch learnt meanwhile forgotten (:meth:`SymMirror.restore`). torch keeps a patched
    setting per thread (a ``ContextVar``): another thread's ``torch.compile`` meanwhile
    is not affected.
    """
    import torch.fx.experimental._config as fx_config

    with fx_config.patch(backed_size_oblivious=True):
        yield


def _failure(e: Exception, m: SymMirror, what: str) -> FakeInferenceError:
    """The error to report for an exception torch raised computing ``what``'s output type."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    cond = getattr(e, "cond", None)
    inner = {s for s in getattr(cond, "free_symbols", ()) if _is_unbacked(s)} - set(m.theirs_to_ours)
    if isinstance(e, GuardOnDataDependentSymNode) and inner:
        # torch's own code decides on a number it read from a tensor argument
        # during this call (tensor_split's count of sections from a 0-d tensor):
        # the result's structure depends on data no capture sees
        return FakeInferenceError(
            f"{what}: the result depends on a number read from a tensor argument's data "
            "(torch's implementation decides on it), which is known only when the "
            "compiled code runs; pass that argument as a Python int (or list of ints) "
            "instead of a tensor, or call this outside the compiled function"
        )
    first = (str(e).strip().splitlines() or [""])[0]  # not torch's C++ stack trace
    return FakeInferenceError(f"{what}: torch could not compute the output type: {type(e).__name__}: {first}")


def fake_call(
    ctx: ShapeContext,
    fn: Callable[..., Any],
    inputs: Sequence[Type],
    args: AttrValue,
    kwargs: AttrValue,
    what: str,
    mutates: int | None = None,
    mirror: SymMirror | None = None,
) -> tuple[list[Type], Any]:
    """Types of the flattened outputs of ``fn(*args, **kwargs)`` on inputs of ``inputs`` types,
    and the output's pytree spec (a tensor, a tuple, a ``torch.return_types`` record ...)."""
    import torch
    from torch._dispatch.python import enable_python_dispatcher
    from torch.utils import _pytree as pytree

    if ctx.hints is None:
        raise UndecidableError(f"{what}: extern types need example sizes")
    m = mirror if mirror is not None else SymMirror(ctx)
    refs: list[Any] = []
    for t in inputs:
        if isinstance(t, TensorType):
            try:
                refs.append(m.fake_tensor(t))
            except (KeyError, TypeError, NotImplementedError) as e:
                # torch's symbolic sizes cannot hold every size we can (an if-then-else
                # over the sizes of two branches): say so instead of an internal error
                raise FakeInferenceError(
                    f"{what}: torch cannot compute with the size {t} (which branch of an `if` "
                    f"ran decides it; torch's symbolic sizes have no {type(e).__name__}: {e}); "
                    "give both branches the same shape, or call this outside the `if`"
                ) from None
        else:
            refs.append({ScalarKind.bool: True, ScalarKind.int: 1, ScalarKind.float: 1.0}[t.kind])

    # The python dispatcher runs torch's Python meta kernels and decompositions
    # (``torch._refs``, ``torch._decomp``) for composite ops, as torch itself does for
    # symbolic shapes; without it their C++ kernels run and ask the fake tensors for
    # concrete sizes or storage offsets (``diag``, ``trace``, ``linalg.*`` ...).
    def run(call: Callable[..., Any]) -> Any:
        with enable_python_dispatcher(), m.mode, _quiet_meta_log():
            out = call(*materialize(args, refs, m.symint), **materialize(kwargs, refs, m.symint))
            return refs[mutates] if mutates is not None else out  # in place: the updated input

    # advanced indexing: torch's general path first, the example's path when the general
    # one does not fit the example ([Note: torch's general path for sizes])
    general = general_path_applies(what, args if isinstance(args, tuple) else (), refs, mutates)
    before = m.checkpoint()
    try:
        with general_path() if general else contextlib.nullcontext():
            out = run(_index_put_form if general and what == "torch.Tensor.__setitem__" else fn)
    except Exception as e:
        if not general:
            raise _failure(e, m, what) from e
        m.restore(before)
        try:
            out = run(fn)
        except Exception as e:
            raise _failure(e, m, what) from e

    types: list[Type] = []
    leaves, spec = pytree.tree_flatten(out)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = tuple(m.ours(d, what) for d in leaf.shape)
            try:
                dtype = DType.from_torch(leaf.dtype)
            except TypeError as e:  # complex32, uint64 ...
                raise FakeInferenceError(f"{what} returns a tensor Cuvil cannot hold: {e}") from None
            types.append(TensorType(dtype, shape, str(leaf.device)))
        else:
            raise FakeInferenceError(
                f"{what} returns a Python {type(leaf).__name__} computed from tensor data; "
                "data-dependent values are not supported yet"
            )
    m.sync(f"assumed by torch's implementation of {what}")
    return types, spec


__all__ = ["FakeInferenceError", "SymMirror", "fake_call", "general_path", "materialize"]
