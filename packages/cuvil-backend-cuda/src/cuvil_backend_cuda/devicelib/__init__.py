"""The device library generated Triton kernels call as ``cu.<name>(...)``.

Two namespaces with the same names (see :mod:`cuvil_ir.triton_source.functions` for
which the generated text uses): :mod:`.interpreted`, made of ``tl`` builtins only so
that it runs under ``TRITON_INTERPRET=1`` (no libdevice there), and :mod:`.compiled`,
which calls libdevice for accuracy on the GPU. Both re-export the pure-``tl`` helpers
of :mod:`.common`. Each module fixes its own mode when it decorates (whatever
``TRITON_INTERPRET`` says), so both can be loaded in one process.
"""

from __future__ import annotations

import types

#: every name a generated kernel may call on ``cu``
NAMES = (
    "exp expm1 log log1p log2 sin cos tan atan atan2 tanh erf pow trunc round fmod remainder"
    " floordiv mod fmod_int truncdiv iabs sign fmax fmin rand prod_combine welford_combine"
).split()


def namespace(interpret: bool) -> types.ModuleType:
    """The module to bind as ``cu`` in a generated kernel's globals."""
    if interpret:
        from . import interpreted

        return interpreted
    from . import compiled

    return compiled
