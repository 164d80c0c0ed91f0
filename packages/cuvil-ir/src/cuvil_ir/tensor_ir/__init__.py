"""Tensor IR: kernels (fused index functions), extern calls and buffers with an arena plan.

See docs/tensor-and-loop-ir.md.
"""

from cuvil_ir.tensor_ir.lower import FusionPolicy, lower
from cuvil_ir.tensor_ir.program import Buffer, Control, Extern, Kernel, TensorProgram, View

__all__ = ["Buffer", "Control", "Extern", "FusionPolicy", "Kernel", "TensorProgram", "View", "lower"]
