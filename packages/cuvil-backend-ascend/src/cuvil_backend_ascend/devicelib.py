"""The ``cu`` namespace for kernels compiled by triton-ascend (on an NPU, and in the
compile check): Ascend's own math (``tl.math`` as triton-ascend patches it, and its
``libdevice`` for what ``tl`` lacks), plus the shared integer, Philox and
NaN-propagating helpers of :mod:`cuvil_runtime.triton_kernels.devicelib.common`.

Imports triton-ascend's ``triton`` (``triton.language.extra.ascend``): importable
only where triton-ascend is the installed triton. Float functions take float32
(float64 never reaches an Ascend kernel: :data:`cuvil_backend_ascend.policy.FUSION`).
"""

from __future__ import annotations

import triton.language as tl
from triton.language.extra.ascend import libdevice

from cuvil_ir.scalar_functions import LIBDEVICE
from cuvil_runtime.triton_kernels.devicelib import common

_jit = common.jit(False)

globals().update(common.decorated(False))  # floordiv, mod, ... rand, the bf16 conversions
_remainder_of = _jit(common.remainder_of)


@_jit
def exp(x):
    return tl.exp(x)


@_jit
def log(x):
    return tl.log(x)


@_jit
def log2(x):
    return tl.log2(x)


@_jit
def sin(x):
    return tl.sin(x)


@_jit
def cos(x):
    return tl.cos(x)


@_jit
def atan2(y, x):
    # tl.math's (y, x) order: triton-ascend's libdevice.atan2 passes its operands swapped
    return tl.math.atan2(y, x)


@_jit
def erf(x):
    return tl.erf(x)


@_jit
def round(x):
    """Round half to even (torch.round)."""
    return libdevice.nearbyint(x)


@_jit
def remainder(a, b):
    return _remainder_of(libdevice.fmod(a, b), b)


#: the device functions that are libdevice's own, bound directly (an extern call inlines
#: as a jit-ed wrapper's would); those written above keep their own form
globals().update({n: getattr(libdevice, n) for n in LIBDEVICE if n not in globals()})
