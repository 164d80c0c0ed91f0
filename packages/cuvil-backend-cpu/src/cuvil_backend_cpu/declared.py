"""What the ``cpu`` target declares: its capabilities and its stages, in order.

A module of its own so that the cheap entry point (:mod:`cuvil_backend_cpu.backend`)
and the target (:mod:`cuvil_backend_cpu.target`) both read them without importing
each other.
"""

from __future__ import annotations

from cuvil_runtime.target import GRAPH_STAGE, TENSOR_STAGE, WRAPPER_STAGE, Capabilities, Stage

CAPABILITIES = Capabilities(
    devices=frozenset({"cpu"}),
    control_flow=True,
    extern_calls=True,
    data_dependent_sizes=True,
    strided_inputs=True,
)

#: the pipeline, in order (``cu.audit`` and ``CUVIL_DUMP`` list these)
STAGES = (
    GRAPH_STAGE,
    TENSOR_STAGE,
    Stage("loop_ir", "each kernel's loop nest: parallel, SIMD and tiled loops", per_kernel=True),
    Stage("c", "each kernel's C source (OpenMP, SIMD), built by the system C compiler", "c", per_kernel=True),
    WRAPPER_STAGE,
)

__all__ = ["CAPABILITIES", "STAGES"]
