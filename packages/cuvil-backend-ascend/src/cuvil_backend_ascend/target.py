"""The ``ascend`` target: its stages, and the hooks the shared Tensor IR pipeline calls.

What the ``ascend`` target does that another target would not: its policy and rules
(:mod:`cuvil_backend_ascend.policy`), Triton source under those rules
(:mod:`cuvil_ir.triton_source`, shared with the ``cuda`` target), every kernel
checked against the launch rules when it is compiled (:mod:`cuvil_backend_ascend.rules`)
and, where triton-ascend is the installed triton, run through Ascend's compiler
front half (:mod:`cuvil_backend_ascend.compiler`: the ``ttir`` and ``linalg``
stages), and launches with a grid of one program per vector core
(:mod:`cuvil_backend_ascend.launch`). Lowering, the program cache, regions, stage
texts, dumps and the per-call runner (its arena on the device) are
:mod:`cuvil_runtime.pipeline`'s.

In simulation (``CUVIL_ASCEND_SIM=1``) the kernels run in Triton's interpreter on
CPU tensors, with the same rules checked at every launch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
from collections.abc import Callable, Sequence
from typing import Any

import cuvil_backend_ascend
import cuvil_ir
import cuvil_runtime
from cuvil_backend_ascend import paged_attention
from cuvil_backend_ascend.declared import ASCEND_COMPILER, CAPABILITIES, SIM, STAGES, cann_missing
from cuvil_backend_ascend.launch import make_launch
from cuvil_backend_ascend.policy import FUSION, POLICY, RULES, AscendPolicy
from cuvil_backend_ascend.rules import validate
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.emit import TritonKernel, generate_triton
from cuvil_runtime.cache import default_cache_dir
from cuvil_runtime.pipeline import compile_program, package_hash
from cuvil_runtime.target import CompileOptions, Launch


@functools.cache
def device_cores(default: int) -> int:
    """Vector cores of the current NPU (the driver's count), else ``default``."""
    if SIM or cann_missing() is not None:  # no device to ask (the compile check, or no CANN)
        return default
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_aivector_core_num())
    except Exception:  # an older triton-ascend without the query: the documented default
        return default


def _device_library() -> types.ModuleType:
    if SIM:
        from cuvil_runtime.triton_kernels.devicelib import interpreted

        return interpreted
    from cuvil_backend_ascend import devicelib

    return devicelib


class AscendTarget:
    name = "ascend"
    capabilities = CAPABILITIES
    stages = STAGES
    #: what a cached program's kernels are made of (plain data for the program cache)
    codec_classes = (TritonKernel,)

    def __init__(self, policy: AscendPolicy = POLICY) -> None:
        self.policy = policy
        self.cores = device_cores(policy.cores)
        self.root = default_cache_dir()

    # -- the Target contract ------------------------------------------------------------
    def hash(self) -> str:
        """The compiler's own code (cuvil_ir, cuvil_runtime, this package), triton's
        version, the mode, the policy and the core count."""
        import triton

        mode = "sim" if SIM else "npu"
        compiler = "triton-ascend" if ASCEND_COMPILER else "triton"
        return _hash(
            package_hash(cuvil_ir, cuvil_runtime, cuvil_backend_ascend),
            f"{compiler} {triton.__version__} {mode} {self.policy!r} cores={self.cores}",
        )

    def compile(self, graph: Graph, options: CompileOptions) -> Any:
        return compile_program(self, graph, options, self.root / "ascend-programs")

    # -- the KernelBackend hooks ----------------------------------------------------------
    def fusion_policy(self, options: CompileOptions) -> FusionPolicy:
        return FUSION

    def generate(self, kernel: Kernel, program: TensorProgram, options: CompileOptions) -> TritonKernel:
        tk = generate_triton(kernel, program, RULES)
        validate(tk, self.policy, self.cores)  # a kernel no launch can run is a compile error
        if not ASCEND_COMPILER:
            return tk
        from cuvil_backend_ascend.compiler import compile_stages

        return dataclasses.replace(tk, compiled=compile_stages(tk, self.policy))

    def kernel_texts(self, code: TritonKernel) -> dict[str, str]:
        return {"triton": code.source, **dict(code.compiled)}

    def build(self, codes: Sequence[tuple[str, TritonKernel]], label: str) -> list[Launch]:
        cu = _device_library()
        mode = "interpreted" if SIM else "ascend"
        launches = []
        for _, tk in codes:
            validate(tk, self.policy, self.cores)  # also for kernels from the program cache
            launches.append(make_launch(tk, cu, mode, self.policy, self.cores))
        return launches

    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        if op == paged_attention.OP:  # the Triton kernel, under the launch rules
            return paged_attention.extern(reference, self.policy, self.cores)
        return reference  # on npu tensors torch dispatches to torch-npu (aclnn: matmul, conv, attention)

    def out_variant(self, op: str) -> Callable[..., Any]:
        raise KeyError(f"the ascend target lowers no extern into planned buffers ({op})")


@functools.cache
def _hash(code: str, toolchain: str) -> str:
    return hashlib.sha256(f"{code}\n{toolchain}".encode()).hexdigest()


__all__ = ["AscendTarget", "device_cores"]
