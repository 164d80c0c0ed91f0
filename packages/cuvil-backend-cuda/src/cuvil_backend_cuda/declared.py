"""What the ``cuda`` target declares: its capabilities, options and stages, in order.

A module of its own so that the cheap entry point (:mod:`cuvil_backend_cuda.backend`)
and the target (:mod:`cuvil_backend_cuda.target`) both read them without importing
triton.
"""

from __future__ import annotations

import os

from cuvil_runtime.target import GRAPH_STAGE, TENSOR_STAGE, WRAPPER_STAGE, Capabilities, Stage


def interpreting() -> bool:
    """Triton's interpreter mode (``TRITON_INTERPRET=1``): kernels run on CPU tensors.
    Read when the process first asks, as Triton reads it when it decorates a kernel."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")


INTERPRET = interpreting()

CAPABILITIES = Capabilities(
    # under the interpreter the target takes CPU tensors, never CUDA ones
    devices=frozenset({"cpu"} if INTERPRET else {"cuda"}),
    control_flow=True,
    extern_calls=True,
    options=frozenset({"cuda_graphs"}),
)

#: the pipeline, in order (``cu.audit`` and ``CUVIL_DUMP`` list these)
STAGES = (
    GRAPH_STAGE,
    TENSOR_STAGE,
    Stage("triton", "each kernel's Triton source (one @triton.jit function)", "py", per_kernel=True),
    Stage(
        "ptx",
        "each kernel compiled ahead of time to PTX (for the GPU present, else for sm_90)",
        "ptx",
        per_kernel=True,
    ),
    WRAPPER_STAGE,
)

__all__ = ["CAPABILITIES", "INTERPRET", "STAGES", "interpreting"]
