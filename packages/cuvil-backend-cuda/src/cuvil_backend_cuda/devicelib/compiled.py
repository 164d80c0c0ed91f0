"""The ``cu`` namespace for compiled kernels: libdevice where it is more accurate than
Triton's builtins (``tl.exp``, ``tl.sin`` ... lower to the ``.approx`` PTX
instructions; ``%`` on floats to ``a - b * trunc(a / b)``, which is not exact), and the
shared integer, Philox and NaN-propagating helpers of :mod:`.common`."""

from __future__ import annotations

from triton.language.extra import libdevice
from triton.language.extra.cuda import libdevice as cuda_libdevice

from cuvil_ir.scalar_functions import LIBDEVICE
from cuvil_runtime.triton_kernels.devicelib import common

_jit = common.jit(False)

globals().update(common.decorated(False))  # floordiv, mod, ... rand, the bf16 conversions
_remainder_of = _jit(common.remainder_of)


@_jit
def round(x):
    """Round half to even (C's nearbyint, torch.round)."""
    return libdevice.nearbyint(x)


@_jit
def remainder(a, b):
    return _remainder_of(libdevice.fmod(a, b), b)


#: the device functions that are libdevice's own, bound directly (an extern call inlines
#: as a jit-ed wrapper's would); those written above keep their own form. From the CUDA
#: module itself: ``triton.language.extra.libdevice`` holds stubs that the compiler maps
#: to it only when they are reached through that module, not as attributes of ``cu``
globals().update({n: getattr(cuda_libdevice, n) for n in LIBDEVICE if n not in globals()})
