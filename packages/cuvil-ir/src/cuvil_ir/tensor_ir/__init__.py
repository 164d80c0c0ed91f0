"""Tensor IR: kernels (fused index functions), extern calls and buffers with an arena plan.

See docs/tensor-and-loop-ir.md.
"""

import sys
import types
from typing import Any

from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Buffer, Control, Extern, Kernel, TensorProgram, View

# Lowering (the module ``lower`` and its rules) is imported when a compile first asks for
# it: a warm start or a loaded artifact decodes and runs a program and never lowers one.
# ``tensor_ir.lower`` stays the *function*, as it was when this package imported it
# eagerly: the import system sets a submodule as its package's attribute when it loads
# it (whoever imports it first), and the package's class below keeps the function there.


def __getattr__(name: str) -> Any:
    if name == "lower":
        from cuvil_ir.tensor_ir.lower import lower

        return lower
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "lower" and isinstance(value, types.ModuleType):
            value = value.lower  # the submodule, just loaded: its function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["Buffer", "Control", "Extern", "FusionPolicy", "Kernel", "TensorProgram", "View", "lower"]
