"""The ``cu`` namespace for compiled kernels: libdevice where it is more accurate than
Triton's builtins (``tl.exp``, ``tl.sin`` ... lower to the ``.approx`` PTX
instructions; ``%`` on floats to ``a - b * trunc(a / b)``, which is not exact), and the
shared integer, Philox and NaN-propagating helpers of :mod:`.common`."""

from __future__ import annotations

from triton.language.extra import libdevice

from cuvil_runtime.triton_kernels.devicelib import common

_jit = common.jit(False)

globals().update(common.decorated(False))  # floordiv, mod, ... rand: common.SHARED
_remainder_of = _jit(common.remainder_of)


@_jit
def exp(x):
    return libdevice.exp(x)


@_jit
def expm1(x):
    return libdevice.expm1(x)


@_jit
def log(x):
    return libdevice.log(x)


@_jit
def log1p(x):
    return libdevice.log1p(x)


@_jit
def log2(x):
    return libdevice.log2(x)


@_jit
def sin(x):
    return libdevice.sin(x)


@_jit
def cos(x):
    return libdevice.cos(x)


@_jit
def tan(x):
    return libdevice.tan(x)


@_jit
def atan(x):
    return libdevice.atan(x)


@_jit
def asinh(x):
    return libdevice.asinh(x)


@_jit
def atan2(y, x):
    return libdevice.atan2(y, x)


@_jit
def tanh(x):
    return libdevice.tanh(x)


@_jit
def erf(x):
    return libdevice.erf(x)


@_jit
def pow(a, b):
    return libdevice.pow(a, b)


@_jit
def trunc(x):
    return libdevice.trunc(x)


@_jit
def round(x):
    """Round half to even (C's nearbyint, torch.round)."""
    return libdevice.nearbyint(x)


@_jit
def fmod(a, b):
    return libdevice.fmod(a, b)


@_jit
def remainder(a, b):
    return _remainder_of(libdevice.fmod(a, b), b)
