"""What the rules share: result types, constants and casts, scalar calls, broadcast
elements, pointwise maps and reductions over lazy tensors."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.decompose import LOW_PRECISION
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, TensorType, promote_types, stored_float
from cuvil_ir.symbolic import Dim
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx


def out_type(n: Node, k: int = 0) -> TensorType:
    t = n.outputs[k].type
    assert isinstance(t, TensorType)
    return t


def float_attr(n: Node, name: str) -> float:
    v: Any = n.attr(name)
    return float(v)


def ints_attr(n: Node, name: str) -> tuple[int, ...]:
    v: Any = n.attr(name)
    return tuple(int(x) for x in v)


def const(value: Any, dtype: DType) -> E.Const:
    if dtype == DType.bool:
        return E.Const(bool(value), dtype)
    if dtype in OPMATH:  # a half constant holds what a half tensor would ([Note: opmath])
        return E.Const(stored_float(float(value), dtype), dtype)
    if dtype.is_floating:
        return E.Const(float(value), dtype)
    return E.Const(int(value), dtype)


def cast(e: E.Expr, dtype: DType) -> E.Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, E.Const) and not (
        isinstance(e.value, float) and not math.isfinite(e.value) and not dtype.is_floating
    ):
        return const(e.value, dtype)
    return E.Call("cast", (e,), dtype)


def call(fn: str, *args: E.Expr, dtype: DType | None = None) -> E.Expr:
    return E.Call(fn, tuple(args), dtype or args[0].dtype)


def element(v: Val, out_shape: Sequence[Dim], index: Sequence[Any] | None = None) -> E.Expr:
    """``v`` broadcast to ``out_shape`` (numpy rules), at ``index`` (default: ``_i0 ...``)."""
    if not isinstance(v, Lazy):
        return v
    index = list(index if index is not None else idx(len(out_shape)))
    lead = len(out_shape) - v.rank
    sub = []
    for d in range(v.rank):
        od = out_shape[lead + d]
        if v.shape[d] == 1 and od != 1:
            sub.append(sympy.Integer(0))
        else:
            sub.append(index[lead + d])
    return v.at(sub)


#: [Note: opmath] Eager torch computes elementwise math and reductions of float16 and
#: bfloat16 tensors in float32 (ATen's ``opmath_type``): operands are widened, the op
#: computes in float32 (a reduction accumulates there) and its result is rounded to the
#: storage type once, where the op stores it. Rules do the same: a dtype here computes in
#: the one it maps to, and ``cast`` back to the result's dtype is that rounding. So a
#: fused chain of half ops rounds after every op, exactly where eager rounds, and gives
#: eager's bits (up to the float32 math itself). Composite ops compute in float32 between
#: their operands and their result, as eager's fused kernels (softmax, layer_norm) do
#: (:data:`cuvil_ir.graph_ir.decompose.LOW_PRECISION`).
OPMATH: dict[DType, DType] = {d: DType.f32 for d in LOW_PRECISION}


def opmath(dtype: DType) -> DType:
    """The dtype eager computes ``dtype`` math in (see [Note: opmath])."""
    return OPMATH.get(dtype, dtype)


def pointwise(
    n: Node, fn: Callable[..., E.Expr], *vals: Val, compute: DType | None = None, wide_scalar: bool = False
) -> Lazy:
    """``fn`` of the broadcast operands' elements; with ``compute``, the operands are
    cast to ``compute`` and then to ``opmath(compute)`` (the dtype eager computes
    ``compute`` math in: see [Note: opmath]). The result is cast to the node's result dtype.

    Casting to ``compute`` first is eager's rule for half types: an operand of another
    dtype (a Python number, a 0-d float32 tensor, a float32 threshold) is converted to the
    common dtype before the op widens it, so ``x - 0.1`` subtracts bfloat16's 0.1. Eager's
    ``mul`` and ``div`` take their second operand at full precision when it is a scalar
    (ATen reads the original scalar in float32): ``wide_scalar`` says so."""
    t = out_type(n)
    args = [element(v, t.shape) for v in vals]
    if compute is not None:
        wide = opmath(compute)
        if wide != compute:
            args = [
                a if wide_scalar and k == 1 and _is_scalar(n, k) else cast(a, compute)
                for k, a in enumerate(args)
            ]
        args = [cast(a, wide) for a in args]
    return Lazy(t.shape, t.dtype, cast(fn(*args), t.dtype))


def _is_scalar(n: Node, k: int) -> bool:
    """Operand ``k`` is what TensorIterator calls a CPU scalar: a number or a 0-d tensor."""
    if k >= len(n.inputs):
        return True  # a constant the rule made
    ty = n.inputs[k].type
    return not isinstance(ty, TensorType) or ty.rank == 0


def compute_dtype(n: Node) -> DType:
    """The dtype torch computes a comparison in (promotion of its operands)."""
    return promote_types(*(v.type for v in n.inputs))


def norm_dims(dims: Any, rank: int) -> tuple[int, ...]:
    if dims is None or dims == ():
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({d % max(rank, 1) for d in dims}))


def reduce(
    lw: LoweringContext,
    kind: str,
    x: Lazy,
    dims: Sequence[int],
    body: Callable[[E.Expr], E.Expr] | None = None,
    out_index: Sequence[Any] | None = None,
    keep: bool = True,
    dtype: DType | None = None,
) -> E.Expr:
    """``kind`` over ``dims`` of ``x`` at the kept-dims index ``out_index``.

    ``out_index`` lists one index per dim of ``x`` when ``keep`` (reduced dims'
    entries are ignored), else one per kept dim.
    """
    rsyms = {d: lw.reduce_symbol() for d in dims}
    out_index = list(out_index if out_index is not None else idx(x.rank if keep else x.rank - len(dims)))
    full: list[Any] = []
    k = 0
    for d in range(x.rank):
        if d in rsyms:
            full.append(rsyms[d])
            if keep:
                k += 1
        else:
            full.append(out_index[k])
            k += 1
    e = x.at(full)
    if dtype is not None:
        e = cast(e, dtype)
    if body is not None:
        e = body(e)
    return E.make_reduce(kind, e, tuple((rsyms[d], sympy.sympify(x.shape[d])) for d in dims), e.dtype)


def count(x: Lazy, dims: Sequence[int], dtype: DType) -> E.Expr:
    n: Any = sympy.Integer(1)
    for d in dims:
        n = n * x.shape[d]
    n = sympy.expand(n)
    return const(int(n), dtype) if n.is_Integer else cast(E.Index(n, DType.i64), dtype)


def tensor_operand(v: Val) -> Lazy:
    if not isinstance(v, Lazy):
        raise NotLowered("scalar where a tensor was expected")
    return v
