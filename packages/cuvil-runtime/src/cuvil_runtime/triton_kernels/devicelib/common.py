"""Device helpers both namespaces share: built only from ``tl`` builtins, so they are
right in the interpreter and in compiled code alike.

The functions here are plain Python; each namespace module decorates them with
:func:`jit` for its own mode (``floordiv = jit(True)(common.floordiv)``), so one process
can hold an interpreted and a compiled library at once (Triton fixes a function's mode
when ``triton.jit`` decorates it). They call no other device function: a helper's
globals are this module's, where no decorated function lives.

Integer helpers take two operands of one dtype, int32 or int64 (the generated text
widens narrower types to int32 and narrows the result again, as C's promotion does).
Binary helpers broadcast their operands first: in the interpreter a comparison of
0-d values is typed like its operands (Triton 3.9), which breaks combining it with a
block's comparison. A zero divisor gives 0 and never traps (the kernel records the error separately);
``b == -1`` is answered without dividing, so ``INT_MIN // -1`` wraps as in C. They
hold whether the builtin ``//`` truncates (compiled) or floors: each result is
corrected from the remainder ``a - (a // b) * b``, whose sign tells which one ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl


def jit(interpret: bool) -> Callable[[Callable[..., Any]], Any]:
    """``triton.jit`` for ``interpret`` mode (``TRITON_INTERPRET`` is read when
    decorating), whatever the environment says. A Triton without ``triton.knobs``
    (before 3.4: triton-ascend 3.2) reads the mode from the environment only."""
    knobs = getattr(triton, "knobs", None)

    def decorate(fn: Callable[..., Any]) -> Any:
        if knobs is None:
            return triton.jit(fn)
        with knobs.runtime.scope():
            knobs.runtime.interpret = interpret
            return triton.jit(fn)

    return decorate


def floordiv(a, b):
    """``a // b`` as Python: the quotient rounded toward minus infinity; 0 for ``b == 0``."""
    a, b = tl.broadcast(a, b)
    d = tl.where((b == 0) | (b == -1), tl.full([], 1, b.dtype), b)
    q = a // d
    r = a - q * d
    q = tl.where((r != 0) & ((r < 0) != (d < 0)), q - 1, q)
    q = tl.where(b == -1, 0 - a, q)
    return tl.where(b == 0, tl.full([], 0, q.dtype), q)


def mod(a, b):
    """``a % b`` as Python: the sign of the divisor; 0 for ``b == 0``."""
    a, b = tl.broadcast(a, b)
    d = tl.where((b == 0) | (b == -1), tl.full([], 1, b.dtype), b)
    r = a - (a // d) * d
    r = tl.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return tl.where((b == 0) | (b == -1), tl.full([], 0, r.dtype), r)


def fmod_int(a, b):
    """C's ``a % b``: the sign of the dividend; 0 for ``b == 0``."""
    a, b = tl.broadcast(a, b)
    d = tl.where((b == 0) | (b == -1), tl.full([], 1, b.dtype), b)
    r = a - (a // d) * d
    r = tl.where((r != 0) & ((r < 0) != (a < 0)), r - d, r)
    return tl.where((b == 0) | (b == -1), tl.full([], 0, r.dtype), r)


def truncdiv(a, b):
    """C's ``a / b``: the quotient rounded toward zero; 0 for ``b == 0``."""
    a, b = tl.broadcast(a, b)
    d = tl.where((b == 0) | (b == -1), tl.full([], 1, b.dtype), b)
    q = a // d
    r = a - q * d
    q = tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)
    q = tl.where(b == -1, 0 - a, q)
    return tl.where(b == 0, tl.full([], 0, q.dtype), q)


def iabs(a):
    """``a < 0 ? -a : a`` (the most negative value stays itself)."""
    return tl.where(a < 0, -a, a)


def sign(a):
    """``(a > 0) - (a < 0)`` in ``a``'s dtype: 0 for NaN and for -0.0."""
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


def fmax(a, b):
    """Float maximum propagating NaN from either side (``a`` on ties, as the C form)."""
    a, b = tl.broadcast(a, b)
    return tl.where((a > b) | (a != a), a, b)


def fmin(a, b):
    """Float minimum propagating NaN from either side."""
    a, b = tl.broadcast(a, b)
    return tl.where((a < b) | (a != a), a, b)


def remainder_of(r, b):
    """Python's float ``a % b`` from ``r = fmod(a, b)``: moved to the divisor's sign."""
    r, b = tl.broadcast(r, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def rand(seed, counter):
    """Uniform float32 in [0, 1): Philox4x32-10 of counter ``(lo(counter), hi(counter), 0, 0)``
    under key ``(lo(seed), hi(seed))``, ``(c0 >> 8) * 2**-24`` -- bit for bit the CPU
    target's ``cu_rand``."""
    seed = seed.to(tl.int64)
    counter = counter.to(tl.int64)
    c0 = counter.to(tl.uint32)
    c1 = (counter >> 32).to(tl.uint32)
    c2 = c0 ^ c0
    c3 = c0 ^ c0
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    round_a = tl.full([], 0xD2511F53, tl.uint32)
    round_b = tl.full([], 0xCD9E8D57, tl.uint32)
    key_a = tl.full([], 0x9E3779B9, tl.uint32)
    key_b = tl.full([], 0xBB67AE85, tl.uint32)
    for _ in tl.static_range(10):
        n0 = tl.umulhi(round_b, c2) ^ c1 ^ k0
        n2 = tl.umulhi(round_a, c0) ^ c3 ^ k1
        c1 = round_b * c2
        c3 = round_a * c0
        c0 = n0
        c2 = n2
        k0 = k0 + key_a
        k1 = k1 + key_b
    return (c0 >> 8).to(tl.float32) * 5.9604644775390625e-08


def round_f16(x):
    """Float32 ``x`` rounded to float16 (to nearest, ties to even; overflow is inf) and
    widened back: the value a float16 tensor would hold ([Note: half precision in
    Triton]). A conversion both modes round correctly (numpy's in the interpreter)."""
    return x.to(tl.float16).to(tl.float32)


def round_bf16(x):
    """Float32 ``x`` rounded to bfloat16 (to nearest, ties to even: ``cvt.rn.bf16.f32`` on
    sm_90, ``arith.truncf`` on Ascend) and widened back: compiled code's conversion (the
    interpreter binds :func:`round_bf16_bits` instead)."""
    return x.to(tl.bfloat16).to(tl.float32)


def to_bf16(x):
    """Float32 ``x`` rounded to a bfloat16 element (to nearest, ties to even): compiled code's."""
    return x.to(tl.bfloat16)


def widen_bf16(x):
    """Bfloat16 ``x`` as float32 (exact): compiled code's."""
    return x.to(tl.float32)


#: compiled code's bfloat16 conversions (a compiled namespace adds them to :data:`SHARED`'s)
COMPILED_BF16 = ("round_bf16", "to_bf16", "widen_bf16")


def widen_bf16_bits(x):
    """Bfloat16 ``x`` as float32: its bits are a float32's upper half (exact, subnormals
    included). The interpreter's ``cu.widen_bf16`` (its conversion flushes subnormals)."""
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


def round_bf16_bits(x):
    """Float32 ``x`` rounded to bfloat16 with integers, widened back: add ``0x7FFF`` plus
    the lowest kept bit (ties to even), drop the low half; NaN stays NaN (the rounding
    could make it inf). Torch's own rounding; the interpreter's ``cu.round_bf16`` (its
    float32 -> bfloat16 conversion truncates)."""
    u = x.to(tl.uint32, bitcast=True)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, r.to(tl.float32, bitcast=True))


def to_bf16_bits(x):
    """Float32 ``x`` rounded to a bfloat16 element (the store's narrowing; NaN is
    ``0x7FC0``, as torch stores it): the interpreter's ``cu.to_bf16`` (its own conversion
    truncates and flushes subnormals)."""
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


def prod_combine(a, b):
    """The combine function of a product reduction (``tl.reduce(x, axis, cu.prod_combine)``)."""
    return a * b


def welford_combine(m1, q1, c1, m2, q2, c2):
    """Merge two (mean, sum of squared deviations, count) partials (Chan, Golub and
    LeVeque's parallel form of Welford's update); the combine function of the looped
    mean/variance reduction (``tl.reduce((m, q, c), axis, cu.welford_combine)``)."""
    c = c1 + c2
    w = tl.where(c == 0, 0.0, c2 / tl.where(c == 0, 1.0, c))
    d = m2 - m1
    return m1 + d * w, q1 + q2 + d * d * c1 * w, c


#: the helpers above every namespace re-exports (``remainder_of`` each binds privately:
#: its ``remainder`` calls it after its own ``fmod``)
SHARED = (
    "floordiv mod fmod_int truncdiv iabs sign fmax fmin rand prod_combine welford_combine round_f16".split()
)


def decorated(interpret: bool) -> dict[str, Any]:
    """The :data:`SHARED` helpers ``triton.jit``-ed for ``interpret`` mode, by name: a
    namespace module binds them with ``globals().update(common.decorated(...))``."""
    decorate = jit(interpret)
    names = SHARED if interpret else (*SHARED, *COMPILED_BF16)
    return {n: decorate(globals()[n]) for n in names}
