"""Tensor IR: kernels (fused index functions), extern calls and buffers with an arena plan.

See docs/tensor-and-loop-ir.md.
"""

from typing import Any

from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Buffer, Control, Extern, Kernel, TensorProgram, View


def __getattr__(name: str) -> Any:
    # lowering (its rules, ~30 ms of imports) is imported when a compile asks for it: a
    # warm start or a loaded artifact decodes and runs a program and never lowers one
    if name == "lower":
        from cuvil_ir.tensor_ir.lower import lower

        return lower
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Buffer", "Control", "Extern", "FusionPolicy", "Kernel", "TensorProgram", "View", "lower"]
