"""The ``ascend`` target's entry point: Graph IR -> Tensor IR -> Triton-Ascend kernels.

Registered by this distribution's ``cuvil.backends`` entry point ``ascend``.
Importing this module is cheap: ``check`` looks for the vendor stack without
importing it (CANN's files, the ``torch_npu`` and ``triton`` packages' locations)
and imports torch-npu only when all of it is there; the target itself
(:mod:`cuvil_backend_ascend.target`) is imported when first used. ``target=None``
picks ``ascend`` only for ``npu`` tensors (no other target takes them).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from cuvil_backend_ascend.declared import (
    CAPABILITIES,
    SIM,
    STAGES,
    cann_missing,
    enter_simulation,
    has_triton_ascend,
    triton_root,
)
from cuvil_runtime.target import BackendSpec

INSTALL = "pip install 'cuvil[ascend]' on a host with CANN, torch-npu and triton-ascend"
#: what each missing piece of the vendor stack takes (docs/ascend-backend.md, "Running on a host")
FIXES = {
    "CANN": "install the CANN toolkit, then `source <ascend-toolkit>/set_env.sh`",
    "torch-npu": "pip install torch-npu (it pins its torch)",
    "triton-ascend": "pip install triton-ascend, in an environment without upstream triton",
}
SIM_INSTALL = "pip install 'cuvil-backend-ascend[sim]'"


def _factory() -> Any:
    from cuvil_backend_ascend.target import AscendTarget

    return AscendTarget()


def missing_pieces() -> dict[str, str]:
    """Each piece of the vendor stack that is missing here -> what was found instead."""
    missing: dict[str, str] = {}
    cann = cann_missing()
    if cann is not None:
        missing["CANN"] = cann
    if importlib.util.find_spec("torch_npu") is None:
        missing["torch-npu"] = "not installed"
    if not has_triton_ascend():
        root = triton_root()
        missing["triton-ascend"] = "no triton" if root is None else f"the triton at {root} is upstream's"
    return missing


@functools.cache
def _check() -> str | None:
    if SIM:
        if has_triton_ascend() or triton_root() is None:
            found = "triton-ascend's triton" if has_triton_ascend() else "no triton"
            return (
                f"CUVIL_ASCEND_SIM=1 runs kernels in upstream Triton's interpreter, but this environment has "
                f"{found}: {SIM_INSTALL} in an environment without triton-ascend"
            )
        return enter_simulation()
    missing = missing_pieces()
    if missing:
        parts = [f"{name} ({why}: {FIXES[name]})" for name, why in missing.items()]
        return (
            "missing "
            + "; ".join(parts)
            + f". Without an NPU: CUVIL_ASCEND_SIM=1 runs it in Triton's interpreter on CPU tensors ({SIM_INSTALL})"
        )
    try:
        import torch
        import torch_npu  # noqa: F401  (registers the npu device with torch)
    except Exception as e:  # a broken vendor install: say what it raised
        return f"torch_npu failed to import ({type(e).__name__}: {e}); {FIXES['torch-npu']}"
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return "no NPU is visible (torch.npu.is_available() is False): check the driver and ASCEND_RT_VISIBLE_DEVICES"
    return None


BACKEND = BackendSpec(
    name="ascend",
    description="fused Triton-Ascend kernels for Huawei Ascend NPUs (CUVIL_ASCEND_SIM=1: in Triton's interpreter on CPU)",
    factory=_factory,
    check=_check,
    install=INSTALL,
    priority=5,
    capabilities=CAPABILITIES,
    stages=STAGES,
)

__all__ = ["BACKEND", "FIXES", "INSTALL", "missing_pieces"]
