"""The ``example`` target: the hooks the shared Tensor IR pipeline calls.

Everything target-specific is here and in the policy below: what lowering may fuse
(:data:`FUSION`), how the Triton text is shaped (:data:`RULES`) and how each
kernel is launched (:class:`Launcher`). Lowering, the program cache, control flow,
extern calls, the arena and the per-call runner come from ``cuvil_runtime``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import cuvil_backend_example
import cuvil_ir
import cuvil_runtime
from cuvil_backend_example.capabilities import CAPABILITIES, STAGES
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir.hoist import must_realize
from cuvil_ir.tensor_ir.lower import FusionPolicy
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.emit import TritonKernel, TritonRules, generate_triton
from cuvil_runtime.cache import default_cache_dir
from cuvil_runtime.pipeline import compile_program, package_hash
from cuvil_runtime.target import CompileOptions, Launch
from cuvil_runtime.triton_kernels import load as loader
from cuvil_runtime.triton_kernels.devicelib import interpreted

#: this target's own choices: no float64 kernels, every reduction at its kernel's rows
FUSION = FusionPolicy(
    realize_reduction=must_realize,
    dtypes=FusionPolicy().dtypes - {DType.f64},
    native="example",  # cu.custom_op(..., lower={"example": "<Triton expression>"})
)
#: a grid of at most MAX_PROGRAMS programs, each looping over its blocks; two-pass variance
RULES = TritonRules(persistent=True, welford=False)
BLOCK = 256
ROW_TILE = 1024
MAX_PROGRAMS = 8


class Launcher:
    """Block sizes from the sizes: ``d0`` (elements or rows) and ``d1`` (a row's length)."""

    def __init__(self, tk: TritonKernel) -> None:
        self.tk = tk
        self.fn = loader.load(tk, interpreted, "interpreted")
        self.first_derived = len(tk.buffers) + len(tk.sizes)

    def __call__(self, *args: Any) -> int:
        d0 = int(args[self.first_derived])
        if d0 <= 0:
            return 0
        if self.tk.rows:
            d1 = int(args[self.first_derived + 1])
            one = loader.pow2(d1) <= ROW_TILE
            config = {"XBLOCK": 1, "RBLOCK": loader.pow2(d1) if one else ROW_TILE, "ONE_TILE": one}
        else:
            config = {"XBLOCK": min(BLOCK, loader.pow2(d0))}
        blocks = -(-d0 // config["XBLOCK"])
        return loader.run(self.fn, self.tk, (min(blocks, MAX_PROGRAMS),), args, config)


class ExampleTarget:
    name = "example"
    capabilities = CAPABILITIES
    stages = STAGES
    codec_classes = (TritonKernel,)

    def hash(self) -> str:
        import triton

        code = package_hash(cuvil_ir, cuvil_runtime, cuvil_backend_example)
        return hashlib.sha256(f"{code} triton {triton.__version__}".encode()).hexdigest()

    def compile(self, graph: Graph, options: CompileOptions) -> Any:
        return compile_program(self, graph, options, default_cache_dir() / "example-programs")

    def fusion_policy(self, options: CompileOptions) -> FusionPolicy:
        return FUSION

    def generate(self, kernel: Kernel, program: TensorProgram, options: CompileOptions) -> TritonKernel:
        return generate_triton(kernel, program, RULES)

    def kernel_texts(self, code: TritonKernel) -> dict[str, str]:
        return {"triton": code.source}

    def build(self, codes: Sequence[tuple[str, TritonKernel]], label: str) -> list[Launch]:
        return [loader.launch_of(tk, Launcher(tk)) for _, tk in codes]

    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        return reference  # torch's own CPU kernels

    def out_variant(self, op: str) -> Callable[..., Any]:
        raise KeyError(f"the example target lowers no extern into planned buffers ({op})")
