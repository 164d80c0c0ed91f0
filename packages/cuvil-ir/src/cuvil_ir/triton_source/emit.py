"""Tensor IR kernel -> the text of one ``@triton.jit`` function (see docs/cuda-backend.md).

The driver of the Triton generator, which emits text and imports no ``triton``: the
``cuda`` and ``ascend`` targets share it and each brings its own Triton. The generated
module uses two names besides ``triton``: ``tl`` (``triton.language``) and ``cu``, the
target's device library (:mod:`cuvil_ir.triton_source.functions` says what it provides).

The generator's parts, in the order they run:

* :mod:`cuvil_ir.triton_source.schedule`: the domain onto programs, tiles and loops;
* :mod:`cuvil_ir.triton_source.patterns`: reductions computed together in one pass;
* :mod:`cuvil_ir.triton_source.render`: values, stores and the module text;
* :mod:`cuvil_ir.triton_source.tiles`: the most tiles live at once;
* :mod:`cuvil_ir.triton_source.kernel`: the result and a target's rules.
"""

from __future__ import annotations

from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.kernel import CUDA_RULES, TritonCodegenError, TritonKernel, TritonRules
from cuvil_ir.triton_source.schedule import Scheduler


def generate_triton(kernel: Kernel, program: TensorProgram, rules: TritonRules = CUDA_RULES) -> TritonKernel:
    """The Triton text of one Tensor IR kernel of ``program`` under a target's ``rules``
    (see the module doc)."""
    return Scheduler(kernel, program, rules).generate()


__all__ = ["CUDA_RULES", "TritonCodegenError", "TritonKernel", "TritonRules", "generate_triton"]
