"""Rules of the elementwise ops (:mod:`cuvil_ir.graph_ir.ops.elementwise`) that are more
than the one scalar function an op may declare (``Op.scalar``, whose rules
:mod:`.scalar` derives): ``round`` with decimals, ``where``, ``pow`` by a constant,
``square``, ``cast``, ``clamp``, ``relu``, and the position-dependent masks
``tril``/``triu``."""

from __future__ import annotations

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import (
    call,
    cast,
    const,
    element,
    opmath,
    out_type,
    pointwise,
)
from cuvil_ir.tensor_ir.rules.scalar import scalar_rule
from cuvil_ir.tensor_ir.rules.table import rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx

# -- elementwise --------------------------------------------------------------------
# An op that declares its scalar function (``Op.scalar``: exp, add, maximum, eq ...) has
# its rule from it (:mod:`.scalar`, filled in by :mod:`.table`); the rules below are
# those of ops whose lowering is more than one function of their elements.
_ROUND = scalar_rule("round")


@rule("round")
def _round(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    if n.attr("decimals", 0) != 0:
        raise NotLowered("round with decimals")
    return _ROUND(lw, n, x)


@rule("where")
def _where(lw: LoweringContext, n: Node, c: Val, a: Val, b: Val) -> Lazy:
    t = out_type(n)
    return Lazy(
        t.shape,
        t.dtype,
        E.Call(
            "where",
            (
                cast(element(c, t.shape), DType.bool),
                cast(element(a, t.shape), t.dtype),
                cast(element(b, t.shape), t.dtype),
            ),
            t.dtype,
        ),
    )


@rule("pow")
def _pow(lw: LoweringContext, n: Node, a: Val, b: Val) -> Lazy:
    t = out_type(n)
    if isinstance(b, E.Const) and t.dtype.is_floating:
        e = b.value
        if e == 2:
            return pointwise(n, lambda x: call("mul", x, x), a, compute=t.dtype)
        if e == 3:
            return pointwise(n, lambda x: call("mul", call("mul", x, x), x), a, compute=t.dtype)
        if e == 1:
            return pointwise(n, lambda x: x, a, compute=t.dtype)
        if e == 0.5:
            return pointwise(n, lambda x: call("sqrt", x), a, compute=t.dtype)
        if e == -1:
            return pointwise(n, lambda x: call("reciprocal", x), a, compute=t.dtype)
    if not t.dtype.is_floating:
        raise NotLowered("integer pow")
    return pointwise(n, lambda x, y: call("pow", x, y), a, b, compute=t.dtype)


@rule("square")
def _square(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: call("mul", a, a), x, compute=out_type(n).dtype)


@rule("cast")
def _cast(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: a, x)


@rule("clamp")
def _clamp(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    lo, hi = n.attr("min"), n.attr("max")
    c = opmath(
        t.dtype
    )  # the bounds are compared in it, as eager does (a half bound rounds once, at the store)

    def f(a: E.Expr) -> E.Expr:
        if lo is not None:
            a = call("max", a, const(lo, c))
        if hi is not None:
            a = call("min", a, const(hi, c))
        return a

    return pointwise(n, f, x, compute=t.dtype)


# -- activations: relu is a primitive; the others lower from their decompositions ----------
@rule("relu")
def _relu(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    # max propagates NaN, as torch's relu does
    return pointwise(n, lambda a: call("max", a, const(0, opmath(t.dtype))), x, compute=t.dtype)


@rule("tril", "triu")
def _triangle(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    diag = n.attr("diagonal")
    i, j = idx(t.rank)[-2:]
    offset = sympy.sympify(j - i - diag)  # tril keeps j - i <= diagonal
    keep = E.Call(
        "le" if n.op == "tril" else "ge", (E.Index(offset, DType.i64), const(0, DType.i64)), DType.bool
    )
    return Lazy(t.shape, t.dtype, E.Call("where", (keep, element(x, t.shape), const(0, t.dtype)), t.dtype))
