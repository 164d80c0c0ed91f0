"""Rules of the elementwise ops (:mod:`cuvil_ir.graph_ir.ops.elementwise`): one scalar
function of the operands' elements at the same index, broadcast to the result, plus
``clamp``, ``relu`` and the position-dependent masks ``tril``/``triu``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.rules.helpers import (
    call,
    cast,
    compute_dtype,
    const,
    element,
    out_type,
    pointwise,
)
from cuvil_ir.tensor_ir.rules.table import Rule, rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx

if TYPE_CHECKING:  # annotations only: lower imports the rules
    from cuvil_ir.tensor_ir.lower import Lowering


# -- elementwise --------------------------------------------------------------------
#: op -> scalar function, for the unary ops that are one function of their operand
_UNARY = {
    **{f: f for f in "neg abs exp expm1 log log1p log2 sqrt rsqrt sin cos tan atan tanh erf sigmoid".split()},
    **{"reciprocal": "reciprocal", "sign": "sign", "bitwise_not": "bitnot"},
}
_ROUNDING = {"floor": "floor", "ceil": "ceil", "trunc": "trunc"}
_BINARY = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "maximum": "max",
    "minimum": "min",
    "atan2": "atan2",
    "fmod": "fmod",
    "remainder": "mod",
    "floor_divide": "floordiv",
    "bitwise_and": "bitand",
    "bitwise_or": "bitor",
    "bitwise_xor": "bitxor",
}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_LOGICAL = {"logical_and": "and", "logical_or": "or", "logical_xor": "xor"}


def _unary(fn: str) -> Rule:
    def lower_unary(lw: Lowering, n: Node, x: Val) -> Lazy:
        t = out_type(n)
        if fn == "bitnot" and t.dtype == DType.bool:
            return pointwise(n, lambda a: call("not", a), x, compute=DType.bool)
        return pointwise(n, lambda a: call(fn, a), x, compute=t.dtype)

    return lower_unary


for _name, _fn in _UNARY.items():
    rule(_name)(_unary(_fn))


@rule(*_ROUNDING)
def _rounding(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    if not t.dtype.is_floating:
        return pointwise(n, lambda a: a, x, compute=t.dtype)
    return pointwise(n, lambda a: call(_ROUNDING[n.op], a), x, compute=t.dtype)


@rule("round")
def _round(lw: Lowering, n: Node, x: Val) -> Lazy:
    if n.attr("decimals", 0) != 0:
        raise NotLowered("round with decimals")
    t = out_type(n)
    if not t.dtype.is_floating:
        return pointwise(n, lambda a: a, x, compute=t.dtype)
    return pointwise(n, lambda a: call("round", a), x, compute=t.dtype)


def float_floordiv(a: E.Expr, b: E.Expr) -> E.Expr:
    """Float ``a // b`` exactly as eager computes it (ATen's ``div_floor_floating``):
    through ``fmod``, not ``floor(a / b)``, so ``inf // 2`` is nan, ``-1 // inf`` is -1
    and a zero quotient keeps the sign of ``a / b``."""
    dt = a.dtype
    zero, one = const(0.0, dt), const(1.0, dt)
    quotient = call("div", a, b)
    mod = call("fmod", a, b)
    div = call("div", call("sub", a, mod), b)
    # a nonzero remainder whose sign differs from b's: the truncated quotient is one too high
    differs = call("xor", call("lt", b, zero, dtype=DType.bool), call("lt", mod, zero, dtype=DType.bool))
    adjust = call("and", call("ne", mod, zero, dtype=DType.bool), differs)
    div = call("where", adjust, call("sub", div, one), div, dtype=dt)
    floor = call("floor", div)
    up = call("gt", call("sub", div, floor), const(0.5, dt), dtype=DType.bool)
    floor = call("where", up, call("add", floor, one), floor, dtype=dt)
    # copysign(0, a / b): the quotient is finite here, and 0 * q carries its sign (no -ffast-math)
    signed_zero = call("mul", quotient, zero)
    result = call("where", call("ne", div, zero, dtype=DType.bool), floor, signed_zero, dtype=dt)
    return call("where", call("eq", b, zero, dtype=DType.bool), quotient, result, dtype=dt)


def _binary(fn: str) -> Rule:
    def lower_binary(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
        t = out_type(n)
        if fn == "floordiv" and t.dtype.is_floating:
            return pointwise(n, float_floordiv, a, b, compute=t.dtype)
        return pointwise(n, lambda x, y: call(fn, x, y), a, b, compute=t.dtype)

    return lower_binary


for _name, _fn in _BINARY.items():
    rule(_name)(_binary(_fn))


@rule(*_COMPARE)
def _compare(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
    c = compute_dtype(n)
    return pointwise(n, lambda x, y: call(_COMPARE[n.op], x, y, dtype=DType.bool), a, b, compute=c)


@rule(*_LOGICAL)
def _logical(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
    return pointwise(n, lambda x, y: call(_LOGICAL[n.op], x, y, dtype=DType.bool), a, b, compute=DType.bool)


@rule("logical_not")
def _logical_not(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: call("not", a, dtype=DType.bool), x, compute=DType.bool)


@rule("where")
def _where(lw: Lowering, n: Node, c: Val, a: Val, b: Val) -> Lazy:
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
def _pow(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
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
def _square(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: call("mul", a, a), x, compute=out_type(n).dtype)


@rule("cast")
def _cast(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: a, x)


@rule("clamp")
def _clamp(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    lo, hi = n.attr("min"), n.attr("max")

    def f(a: E.Expr) -> E.Expr:
        if lo is not None:
            a = call("max", a, const(lo, t.dtype))
        if hi is not None:
            a = call("min", a, const(hi, t.dtype))
        return a

    return pointwise(n, f, x, compute=t.dtype)


# -- activations: relu is a primitive; the others lower from their decompositions ----------
@rule("relu")
def _relu(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    # max propagates NaN, as torch's relu does
    return pointwise(n, lambda a: call("max", a, const(0, t.dtype)), x, compute=t.dtype)


@rule("tril", "triu")
def _triangle(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    diag = n.attr("diagonal")
    i, j = idx(t.rank)[-2:]
    offset = sympy.sympify(j - i - diag)  # tril keeps j - i <= diagonal
    keep = E.Call(
        "le" if n.op == "tril" else "ge", (E.Index(offset, DType.i64), const(0, DType.i64)), DType.bool
    )
    return Lazy(t.shape, t.dtype, E.Call("where", (keep, element(x, t.shape), const(0, t.dtype)), t.dtype))
