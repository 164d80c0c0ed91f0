"""Output types of arbitrary torch calls, from torch's own fake/meta kernels.

This is how ``extern`` nodes get symbolic output types: our size symbols are
mirrored into a torch ``ShapeEnv`` (no duck sizing, no 0/1 specialisation),
fake tensors with those symbolic sizes are built, the torch callable runs under
``FakeTensorMode``, and the symbolic sizes of the results are mapped back. Any
size fact torch had to assume (its guards) becomes an assumption of our graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Ref
from cuvil_ir.graph_ir.types import DType, ScalarKind, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError, as_dim, free_symbols


class FakeInferenceError(Exception):
    """torch could not compute the output type symbolically."""


def _source_class() -> type:
    from torch._guards import GuardSource, Source

    @dataclasses.dataclass(frozen=True)
    class SymbolSource(Source):  # type: ignore[misc]
        label: str = ""

        @property
        def _name_template(self) -> str:
            return self.label

        @property
        def guard_source(self) -> GuardSource:
            return GuardSource.LOCAL

    return SymbolSource


_SOURCE: type | None = None


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
        (tf.TruncToInt, lambda a: sympy.sign(a) * sympy.floor(sympy.Abs(a))),
        (tf.ToFloat, lambda a: a),
        (tf.Identity, lambda a: a),
    ]
    for cls, fn in table:
        if expr.has(cls):
            expr = expr.replace(cls, fn)
    allowed = (sympy.floor, sympy.ceiling, sympy.Mod, sympy.Max, sympy.Min, sympy.Abs, sympy.sign)
    for f in expr.atoms(sympy.Function):
        if not isinstance(f, allowed):
            raise FakeInferenceError(f"cannot represent the size expression {expr} (uses {type(f).__name__})")
    return expr


def fake_call(
    ctx: ShapeContext,
    fn: Callable[..., Any],
    inputs: Sequence[Type],
    args: AttrValue,
    kwargs: AttrValue,
    what: str,
) -> tuple[list[Type], bool]:
    """Types of the flattened outputs of ``fn(*args, **kwargs)`` on inputs of ``inputs`` types,
    and whether the call returned a single tensor (rather than a sequence)."""
    global _SOURCE
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils import _pytree as pytree

    if ctx.hints is None:
        raise UndecidableError(f"{what}: extern types need example sizes")
    if _SOURCE is None:
        _SOURCE = _source_class()
    shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False, assume_static_by_default=False)
    ours_to_theirs: dict[sympy.Symbol, sympy.Expr] = {}
    syms = sorted(
        free_symbols(d for t in inputs if isinstance(t, TensorType) for d in t.shape), key=lambda s: s.name
    )
    for s in syms:
        theirs = shape_env.create_symbol(
            ctx.hint(s), _SOURCE(label=s.name), dynamic_dim=DimDynamic.DYNAMIC, positive=None,
            do_not_specialize_zero_one=True,
        )
        ours_to_theirs[s] = theirs
    theirs_to_ours = {v: k for k, v in ours_to_theirs.items() if isinstance(v, sympy.Symbol)}

    def symint(d: Dim) -> Any:
        if isinstance(d, int):
            return d
        return shape_env.create_symintnode(d.xreplace(ours_to_theirs), hint=ctx.hint(d))

    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=False)
    refs: list[Any] = []
    with mode:
        for t in inputs:
            if isinstance(t, TensorType):
                sizes = [symint(d) for d in t.shape]
                strides, acc = [], 1
                for s in reversed(sizes):
                    strides.append(acc)
                    acc = acc * s
                refs.append(torch.empty_strided(sizes, list(reversed(strides)), dtype=t.dtype.torch, device=t.device))
            else:
                refs.append({ScalarKind.bool: True, ScalarKind.int: 1, ScalarKind.float: 1.0}[t.kind])
        call_args = materialize(args, refs, symint)
        call_kwargs = materialize(kwargs, refs, symint)
        try:
            out = fn(*call_args, **call_kwargs)
        except Exception as e:
            raise FakeInferenceError(f"{what}: torch could not compute the output type: {type(e).__name__}: {e}") from e

    def back(d: Any) -> Dim:
        if isinstance(d, torch.SymInt):
            expr = _plain_sympy(d.node.expr).xreplace(theirs_to_ours)
            stray = {s for s in expr.free_symbols if s not in ours_to_theirs}
            if stray:
                raise FakeInferenceError(f"{what}: the output size depends on tensor data ({d.node.expr})")
            return as_dim(expr)
        return int(d)

    types: list[Type] = []
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor):
            types.append(TensorType(DType.from_torch(leaf.dtype), tuple(back(d) for d in leaf.shape), str(leaf.device)))
        else:
            raise FakeInferenceError(
                f"{what} returns a Python {type(leaf).__name__} computed from tensor data; "
                "data-dependent values are not supported yet"
            )
    for guard in shape_env.guards:
        fact = _plain_sympy(guard.expr).xreplace(theirs_to_ours)
        if fact.free_symbols - set(ours_to_theirs):
            continue
        if fact not in ctx.assumptions and fact != sympy.true:
            ctx.assumptions.append(fact)
            ctx.reasons.setdefault(fact, f"assumed by torch's implementation of {what}")
    return types, isinstance(out, torch.Tensor)


__all__ = ["FakeInferenceError", "fake_call", "materialize"]
