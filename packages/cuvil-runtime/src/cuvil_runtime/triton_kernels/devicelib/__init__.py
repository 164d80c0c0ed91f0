"""The device library generated Triton kernels call as ``cu.<name>(...)``.

Every Triton target binds one module with the names in :data:`NAMES` as ``cu``
(see :mod:`cuvil_ir.triton_source.functions` for which the generated text uses):

* :mod:`.interpreted` -- made of ``tl`` builtins only, so that it runs in Triton's
  interpreter (``TRITON_INTERPRET=1``; no libdevice there): the ``cuda`` target's test
  mode and the ``ascend`` target's simulation;
* a compiled library per target, for its hardware's math: the ``cuda`` target's calls
  libdevice, the ``ascend`` target's triton-ascend's math and libdevice.

All of them re-export the pure-``tl`` helpers of :mod:`.common` (integer division
with Python semantics, NaN-propagating min/max, Philox, reduction combiners).

The float functions come from the table of scalar functions
(:data:`cuvil_ir.scalar_functions.DEVICE_FLOAT`); the compiled libraries bind those
that are libdevice's own directly (:data:`~cuvil_ir.scalar_functions.LIBDEVICE`).
"""

from __future__ import annotations

from cuvil_ir.scalar_functions import TABLE

#: every name a generated kernel may call on ``cu``: the table's device functions, then
#: the helpers (``remainder`` each library writes; the rest are ``common.SHARED``), then the
#: half-precision conversions ([Note: half precision in Triton]: ``round_f16`` shared, the
#: bfloat16 ones ``common.COMPILED_BF16`` in compiled libraries, integer forms in the interpreter's)
NAMES = [
    *(f.name for f in TABLE.values() if f.device),
    *"remainder floordiv mod fmod_int truncdiv iabs sign fmax fmin rand prod_combine welford_combine".split(),
    *"round_f16 round_bf16 to_bf16 widen_bf16".split(),
]

__all__ = ["NAMES"]
