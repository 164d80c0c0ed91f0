"""The ``cu`` namespace for ``TRITON_INTERPRET=1``: built only from ``tl`` builtins.

The interpreter runs ``tl.*`` on numpy and has no libdevice (extern calls return
nothing), so the functions ``tl`` lacks are composed here from exp, log, sin, cos,
floor, ceil and ``%`` (numpy's ``fmod``, exact). A float32 argument is computed in
float64 and rounded once at the end, so float32 results are within about 1 ulp of
the correctly rounded value. Float64 results: exp, log, log2, sin, cos, erf, tan
within a few ulps (numpy's own); expm1, log1p, tanh (Kahan's forms) and atan,
atan2 (Newton on ``sin``/``cos``) and ``pow`` (``exp(b * log|a|)`` with the
logarithm and the product in double-double) within a few ulps (pow: up to ~15 ulps
for huge ``|b * log|a||``, the log's tail being single double). floor, ceil, trunc,
round, fmod and remainder are exact.

A device function of the table (:data:`cuvil_ir.scalar_functions.TABLE`) with no form
written here comes from its decomposition, evaluated in float64 from the functions
here and rounded once (:func:`_float64_form`): a few float64 ulps where the
decomposition is accurate (see its row).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import triton.language as tl

from cuvil_ir import scalar_functions

from . import common

_jit = common.jit(True)

globals().update(common.decorated(True))  # floordiv, mod, ... rand: common.SHARED
_remainder_of = _jit(common.remainder_of)
#: the interpreter converts float32 to bfloat16 by truncating and bfloat16 subnormals to
#: float32 as zero (Triton 3.9's ``_convert_float``): both with integers here
round_bf16 = _jit(common.round_bf16_bits)
widen_bf16 = _jit(common.widen_bf16_bits)
to_bf16 = _jit(common.to_bf16_bits)

_PI = 3.141592653589793
_PI_2 = 1.5707963267948966


@_jit
def exp(x):
    return tl.exp(x.to(tl.float64)).to(x.dtype)


@_jit
def log(x):
    return tl.log(x.to(tl.float64)).to(x.dtype)


@_jit
def log2(x):
    return tl.log2(x.to(tl.float64)).to(x.dtype)


@_jit
def sin(x):
    return tl.sin(x.to(tl.float64)).to(x.dtype)


@_jit
def cos(x):
    return tl.cos(x.to(tl.float64)).to(x.dtype)


@_jit
def erf(x):
    return tl.erf(x.to(tl.float64)).to(x.dtype)


@_jit
def tan(x):
    v = x.to(tl.float64)
    return (tl.sin(v) / tl.cos(v)).to(x.dtype)


@_jit
def _expm1(v):
    # Kahan: (e^v - 1) * v / log(e^v) cancels the rounding error of e^v (v float64)
    u = tl.exp(v)
    um1 = u - 1.0
    y = um1 * v / tl.log(u)
    y = tl.where(u == 1.0, v, y)
    y = tl.where(um1 == -1.0, tl.full([], -1.0, tl.float64), y)
    return tl.where(u == float("inf"), u, y)


@_jit
def expm1(x):
    return _expm1(x.to(tl.float64)).to(x.dtype)


@_jit
def log1p(x):
    v = x.to(tl.float64)
    u = 1.0 + v
    y = tl.log(u) * v / (u - 1.0)
    y = tl.where(u == 1.0, v, y)
    y = tl.where(v == float("inf"), v, y)
    return y.to(x.dtype)


@_jit
def tanh(x):
    v = x.to(tl.float64)
    a = tl.abs(v)
    t = _expm1(2.0 * a)
    r = t / (t + 2.0)
    r = tl.where(a > 22.0, tl.full([], 1.0, tl.float64), r)
    r = tl.where(v < 0, -r, r)
    r = tl.where(v == 0, v, r)  # keeps -0.0
    return r.to(x.dtype)


@_jit
def _atan_unit(t):
    # atan(t) for 0 <= t <= 1 (float64): a rough start, then Newton on sin(y) - t cos(y) = 0
    y = t / (1.0 + 0.28086 * t * t)
    for _ in tl.static_range(3):
        s = tl.sin(y)
        c = tl.cos(y)
        y = y - (s - t * c) / (c + t * s)
    return y


@_jit
def _atan64(v):
    a = tl.abs(v)
    inv = a > 1.0
    r = _atan_unit(tl.where(inv, 1.0 / a, a))
    r = tl.where(inv, _PI_2 - r, r)
    r = tl.where(v < 0, -r, r)
    return tl.where(v == 0, v, r)  # keeps -0.0


@_jit
def atan(x):
    return _atan64(x.to(tl.float64)).to(x.dtype)


@_jit
def asinh(x):
    # sign(x) * log1p(a + a*a / (1 + sqrt(1 + a*a))), a = |x|, in float64; past 2**28
    # a*a no longer matters and asinh(a) is log(2a)
    v = x.to(tl.float64)
    a = tl.abs(v)
    big = a > 268435456.0
    a2 = tl.where(big, 0.0, a * a)
    r = log1p(a + a2 / (1.0 + tl.sqrt(1.0 + a2)))
    r = tl.where(big, tl.log(a) + 0.6931471805599453, r)
    r = tl.where(v < 0, -r, r)
    r = tl.where(v == 0, v, r)  # keeps -0.0
    return r.to(x.dtype)


@_jit
def _signbit64(v):
    return v.to(tl.int64, bitcast=True) < 0


@_jit
def atan2(y, x):
    vy, vx = tl.broadcast(y.to(tl.float64), x.to(tl.float64))
    ax = tl.abs(vx)
    ay = tl.abs(vy)
    q = ay / ax
    q = tl.where((ax == float("inf")) & (ay == float("inf")), tl.full([], 1.0, tl.float64), q)
    q = tl.where((ax == 0) & (ay == 0), tl.full([], 0.0, tl.float64), q)
    r = _atan64(q)
    r = tl.where(_signbit64(vx), _PI - r, r)
    r = tl.where(_signbit64(vy), -r, r)
    return r.to(y.dtype)


@_jit
def _log_dd(x):
    """log(x) for finite x > 0 as a double-double (hi, lo): x = m * 2**k with m in
    [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1) kept to twice the
    precision, k * log(2) from fdlibm's split constant (exact products)."""
    sub = x < 2.2250738585072014e-308
    xn = tl.where(sub, x * 18014398509481984.0, x)  # 2**54: subnormals to normal
    bits = xn.to(tl.int64, bitcast=True)
    e = (bits >> 52) - 1023
    m = ((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000).to(tl.float64, bitcast=True)
    big = m > 1.4142135623730951
    m = tl.where(big, m * 0.5, m)
    k = (e + big.to(tl.int64) - tl.where(sub, 54, 0)).to(tl.float64)
    u = m - 1.0  # exact
    v = m + 1.0
    v_lo = m - (v - 1.0)  # exact: v + v_lo == m + 1
    s = u / v
    s_lo = (tl.fma(-s, v, u) - s * v_lo) / v
    z = s * s
    t = 1.0 / 25.0
    for j in tl.static_range(11, 0, -1):
        t = t * z + 1.0 / (2 * j + 1)
    tail = 2.0 * s * z * t  # 2 (s**3/3 + s**5/5 + ...), small beside 2s
    hi1 = k * 6.93147180369123816490e-01  # exact: the constant has 21 trailing zero bits
    a2 = 2.0 * s
    total = hi1 + a2
    bb = total - hi1
    err = (hi1 - (total - bb)) + (a2 - bb)  # two-sum
    lo = err + k * 1.90821492927058770002e-10 + 2.0 * s_lo + tail
    hi = total + lo
    return hi, lo - (hi - total)


@_jit
def pow(a, b):
    # C99/torch special cases: x**0 == 1 and 1**y == 1 even for NaN, (-1)**±inf == 1, a
    # negative base gives the parity's sign for an integral exponent and NaN otherwise
    va, vb = tl.broadcast(a.to(tl.float64), b.to(tl.float64))
    ax = tl.abs(va)
    # exp(b * log|a|) with log|a| and the product to twice the precision: a few ulps
    finite = (ax > 0) & (ax < float("inf")) & (tl.abs(vb) < float("inf"))
    l_hi, l_lo = _log_dd(tl.where(finite, ax, tl.full([], 1.0, tl.float64)))
    p = vb * l_hi
    p_lo = tl.fma(vb, l_hi, -p) + vb * l_lo
    precise = tl.exp(p) * (1.0 + p_lo)
    precise = tl.where(tl.abs(p) < 709.0, precise, tl.exp(p + p_lo))  # no inf * small
    r = tl.where(finite, precise, tl.exp(vb * tl.log(ax)))  # zeros, infinities, NaN
    integral = tl.floor(vb) == vb
    half = vb * 0.5
    odd = integral & (tl.floor(half) != half)
    r = tl.where(_signbit64(va) & odd, -r, r)
    finite_negative = (va < 0) & (va > -float("inf"))
    r = tl.where(finite_negative & (integral == 0), tl.full([], float("nan"), tl.float64), r)
    one = tl.full([], 1.0, tl.float64)
    r = tl.where(vb == 0, one, r)
    r = tl.where(va == 1.0, one, r)
    r = tl.where((va == -1.0) & (tl.abs(vb) == float("inf")), one, r)
    return r.to(a.dtype)


@_jit
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@_jit
def round(x):
    """Round half to even (C's nearbyint, torch.round), exact in ``x``'s own dtype."""
    f = tl.floor(x)
    d = x - f  # exact
    parity = f - 2.0 * tl.floor(f * 0.5)  # 1 for odd f, 0 for even
    r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + parity))
    r = tl.where(r == 0, x * 0.0, r)  # a zero keeps x's sign, as nearbyint's
    return tl.where(d == d, r, x)  # inf and NaN are themselves


@_jit
def fmod(a, b):
    return a % b  # numpy's fmod in the interpreter: exact


@_jit
def remainder(a, b):
    return _remainder_of(a % b, b)


#: scalar functions a float64 decomposition may call that are ``tl`` operators or
#: builtins (looked up when called: the interpreter patches ``tl`` while it runs)
_TL64: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "neg": operator.neg,
    "abs": lambda a: tl.abs(a),
    "sqrt": lambda a: tl.sqrt(a),
    "floor": lambda a: tl.floor(a),
    "ceil": lambda a: tl.ceil(a),
    "where": lambda c, a, b: tl.where(c, a, b),
    **{f: getattr(operator, f) for f in ("eq", "ne", "lt", "le", "gt", "ge")},
}


def _call64(fn: str, operands: list[Any]) -> Any:
    form = _TL64.get(fn)
    if form is None:  # a device function of this library (its float64 form is its own)
        form = globals()[fn]
    return form(*operands)


def _float64_form(fn: str) -> Callable[..., Any]:
    """``cu.<fn>`` from ``fn``'s decomposition: its operands in float64, the result rounded
    once to the first operand's dtype. A plain function, not jit-ed: the interpreter
    calls it as Python (it has no source for Triton to rewrite)."""

    def device(*xs: Any) -> Any:
        vs = [x.to(tl.float64) for x in xs]
        if len(vs) == 2:
            vs = list(tl.broadcast(vs[0], vs[1]))
        return scalar_functions.expand(fn, vs, _call64, lambda v: v).to(xs[0].dtype)

    device.__name__ = device.__qualname__ = fn
    return device


globals().update(
    {
        f.name: _float64_form(f.name)
        for f in scalar_functions.TABLE.values()
        if f.device and f.decomposition is not None and f.name not in globals()
    }
)
