"""The ``cuda`` target's entry point: Graph IR -> Tensor IR -> Triton -> PTX, run as CUDA Graphs.

Registered by this distribution's ``cuvil.backends`` entry point ``cuda``.
Importing this module is cheap; ``check`` imports triton and asks torch for a GPU
(memoised), the target itself (:mod:`cuvil_backend_cuda.target`) is imported when
first used. The ``cuda`` target is picked by default only for CUDA tensors (its
priority is below ``cpu``'s, which never takes them).
"""

from __future__ import annotations

import functools
from typing import Any

from cuvil_backend_cuda.declared import CAPABILITIES, INTERPRET, STAGES
from cuvil_runtime.target import BackendSpec

INSTALL = "pip install 'cuvil[cuda]' beside a CUDA build of torch"


def _factory() -> Any:
    from cuvil_backend_cuda.target import CudaTarget

    return CudaTarget()


@functools.cache
def _check() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not installed ({e}): {INSTALL}"
    if INTERPRET:
        return None  # kernels run in Triton's interpreter on CPU tensors
    import torch

    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build: install a CUDA build of torch, "
            "or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter on CPU tensors"
        )
    if not torch.cuda.is_available():
        return (
            "no CUDA GPU is visible (torch.cuda.is_available() is False): check the driver and "
            "CUDA_VISIBLE_DEVICES, or set TRITON_INTERPRET=1 to run the kernels on CPU tensors"
        )
    return None


BACKEND = BackendSpec(
    name="cuda",
    description="fused Triton kernels for NVIDIA GPUs, replayed as CUDA Graphs (TRITON_INTERPRET=1: on CPU)",
    factory=_factory,
    check=_check,
    install=INSTALL,
    priority=5,
    capabilities=CAPABILITIES,
    stages=STAGES,
)

__all__ = ["BACKEND"]
