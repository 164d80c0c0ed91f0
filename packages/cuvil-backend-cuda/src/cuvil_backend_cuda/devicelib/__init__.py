"""The ``cuda`` target's device library: what generated kernels call as ``cu.<name>``.

Two namespaces with the same names (:data:`NAMES`): the interpreter's, shared by
every Triton target (:mod:`cuvil_runtime.triton_kernels.devicelib.interpreted`, made of ``tl``
builtins only, for ``TRITON_INTERPRET=1``), and :mod:`.compiled`, which calls
libdevice for accuracy on the GPU. Each module fixes its own mode when it decorates
(whatever ``TRITON_INTERPRET`` says), so both can be loaded in one process.
"""

from __future__ import annotations

import types

from cuvil_runtime.triton_kernels.devicelib import NAMES


def namespace(interpret: bool) -> types.ModuleType:
    """The module to bind as ``cu`` in a generated kernel's globals."""
    if interpret:
        from cuvil_runtime.triton_kernels.devicelib import interpreted

        return interpreted
    from . import compiled

    return compiled


__all__ = ["NAMES", "namespace"]
