"""The rule of an elementwise op that names its scalar function (``Op.scalar``).

An op declared with ``scalar="max"`` (``maximum``) lowers to that function of its
broadcast operands' elements; nothing here names an op. How the operands are typed
is a property of the function, not of the op: a comparison computes in its
operands' promoted dtype and gives a bool, a logical function computes on bools,
rounding copies an integer, ``bitnot`` of a bool is logical not, and float
``floordiv`` is written out as eager computes it (:func:`float_floordiv`); every
other function computes in the result's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import call, compute_dtype, const, out_type, pointwise
from cuvil_ir.tensor_ir.values import Lazy, Val

#: functions computed in their operands' promoted dtype, with a bool result
COMPARISONS = frozenset("eq ne lt le gt ge".split())
#: functions of truth values: operands and result are bool
LOGICAL = frozenset("and or xor not".split())
#: functions that round a float and copy an integer
ROUNDING = frozenset("floor ceil trunc round".split())
#: functions whose scalar second operand eager takes at float32 precision for a half
#: tensor (ATen's ``original_scalar_value``; others round it to the half type first)
WIDE_SCALAR = frozenset("mul div floordiv".split())


def scalar_rule(fn: str) -> Callable[..., Lazy]:
    """The rule computing scalar function ``fn`` of the operands' elements."""
    if fn in COMPARISONS:

        def lower_comparison(lw: LoweringContext, n: Node, *operands: Val) -> Lazy:
            c = compute_dtype(n)
            return pointwise(n, lambda *xs: call(fn, *xs, dtype=DType.bool), *operands, compute=c)

        return lower_comparison
    if fn in LOGICAL:

        def lower_logical(lw: LoweringContext, n: Node, *operands: Val) -> Lazy:
            return pointwise(n, lambda *xs: call(fn, *xs, dtype=DType.bool), *operands, compute=DType.bool)

        return lower_logical

    def lower_scalar(lw: LoweringContext, n: Node, *operands: Val) -> Lazy:
        t = out_type(n)
        if fn in ROUNDING and not t.dtype.is_floating:
            return pointwise(n, lambda a: a, *operands, compute=t.dtype)
        if fn == "bitnot" and t.dtype == DType.bool:
            return pointwise(n, lambda a: call("not", a), *operands, compute=DType.bool)
        wide = fn in WIDE_SCALAR
        if fn == "floordiv" and t.dtype.is_floating:
            return pointwise(n, float_floordiv, *operands, compute=t.dtype, wide_scalar=wide)
        return pointwise(n, lambda *xs: call(fn, *xs), *operands, compute=t.dtype, wide_scalar=wide)

    return lower_scalar


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
