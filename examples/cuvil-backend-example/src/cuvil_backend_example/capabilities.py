"""What the ``example`` target declares as data: its capabilities and its stages.

Below both :mod:`cuvil_backend_example.backend` (the cheap entry point, which hands them
to the registry) and :mod:`cuvil_backend_example.target` (the target, which carries
them), so neither imports the other for them.
"""

from __future__ import annotations

from cuvil_runtime.target import GRAPH_STAGE, TENSOR_STAGE, WRAPPER_STAGE, Capabilities, Stage

CAPABILITIES = Capabilities(devices=frozenset({"cpu"}), control_flow=True, extern_calls=True)
STAGES = (
    GRAPH_STAGE,
    TENSOR_STAGE,
    Stage("triton", "each kernel's Triton source", "py", per_kernel=True),
    WRAPPER_STAGE,
)

__all__ = ["CAPABILITIES", "STAGES"]
