"""The ``cuda`` target: its stages, and the hooks the shared Tensor IR pipeline calls.

What the ``cuda`` target does that another target would not: its policy
(:mod:`cuvil_backend_cuda.policy`), Triton source for every kernel
(:mod:`cuvil_ir.triton_source`, shared with other Triton targets), the kernels
compiled ahead of time to PTX (the ``ptx`` stage), launches with autotuned block
sizes (:mod:`cuvil_backend_cuda.launch`) and CUDA Graphs
(:mod:`cuvil_backend_cuda.graphs`). Lowering, the program cache, regions, stage
texts, dumps and the per-call runner are :mod:`cuvil_runtime.pipeline`'s.

With ``TRITON_INTERPRET=1`` the kernels run in Triton's interpreter on CPU
tensors (no CUDA Graphs, no autotuning) and the PTX is compiled for ``sm_90``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import cuvil_backend_cuda
import cuvil_ir
import cuvil_runtime
from cuvil_backend_cuda import paged_attention
from cuvil_backend_cuda.autotune import Autotuner, gpu_timer, wall_timer
from cuvil_backend_cuda.declared import CAPABILITIES, STAGES, interpreting
from cuvil_backend_cuda.graphs import GraphedExecutable, graphs_enabled, why_not_graphed
from cuvil_backend_cuda.launch import make_launch
from cuvil_backend_cuda.policy import FUSION, LAUNCH, LaunchPolicy
from cuvil_backend_cuda.ptx import compile_ptx
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.emit import TritonKernel, generate_triton
from cuvil_runtime.cache import default_cache_dir
from cuvil_runtime.pipeline import compile_program, package_hash
from cuvil_runtime.target import CompileOptions, Launch

#: the architecture the ``ptx`` stage targets when no GPU is present (H100/H200)
DEFAULT_ARCH = 90


@functools.cache
def _arch() -> int:
    """The compute capability of the current GPU as an int (90 for 9.0), else :data:`DEFAULT_ARCH`."""
    if interpreting():
        return DEFAULT_ARCH
    import torch

    if not torch.cuda.is_available():
        return DEFAULT_ARCH
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


class CudaTarget:
    name = "cuda"
    capabilities = CAPABILITIES
    stages = STAGES
    #: what a cached program's kernels are made of (plain data for the program cache)
    codec_classes = (TritonKernel,)

    def __init__(self, policy: LaunchPolicy = LAUNCH) -> None:
        self.policy = policy
        self.interpret = interpreting()
        self.root = default_cache_dir()
        self._tuner: Autotuner | None = None

    # -- the Target contract ------------------------------------------------------------
    def hash(self) -> str:
        """The compiler's own code (cuvil_ir, cuvil_runtime, this package), triton's
        version, the mode (interpreter or compiled) and the PTX architecture."""
        import triton

        mode = "interpret" if self.interpret else "compiled"
        return _hash(
            package_hash(cuvil_ir, cuvil_runtime, cuvil_backend_cuda),
            f"{triton.__version__} {mode} sm_{_arch()}",
        )

    def compile(self, graph: Graph, options: CompileOptions) -> Any:
        exe = compile_program(self, graph, options, self.root / "cuda-programs")
        if self.interpret:
            return exe
        may_fail = any(t["may_fail"] for t in _kernel_flags(exe))
        reason = why_not_graphed(exe.program, may_fail)
        return GraphedExecutable(exe, graphs_enabled(dict(options.extra)), reason)

    # -- the KernelBackend hooks ----------------------------------------------------------
    def fusion_policy(self, options: CompileOptions) -> FusionPolicy:
        return FUSION

    def generate(self, kernel: Kernel, program: TensorProgram, options: CompileOptions) -> TritonKernel:
        tk = generate_triton(kernel, program)
        return dataclasses.replace(tk, compiled=(("ptx", compile_ptx(tk, _arch())),))

    def kernel_texts(self, code: TritonKernel) -> dict[str, str]:
        return {"triton": code.source, **dict(code.compiled)}

    def build(self, codes: Sequence[tuple[str, TritonKernel]], label: str) -> list[Launch]:
        launches = []
        for _, tk in codes:
            launch, _launcher = make_launch(tk, self.interpret, self.policy, self.tuner())
            launches.append(launch)
        return launches

    def tuner(self) -> Autotuner | None:
        """The autotuner on a GPU (``CUVIL_CUDA_AUTOTUNE=1`` forces it under the interpreter,
        timed by the wall clock; ``=0`` turns it off)."""
        import os

        setting = os.environ.get("CUVIL_CUDA_AUTOTUNE", "")
        on = setting == "1" or (setting != "0" and not self.interpret and self.policy.autotune)
        if not on:
            return None
        if self._tuner is None:
            if self.interpret:
                self._tuner = Autotuner(self.root / "cuda-autotune", "interpreter", wall_timer)
            else:
                import torch

                self._tuner = Autotuner(self.root / "cuda-autotune", torch.cuda.get_device_name(), gpu_timer)
        return self._tuner

    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        if op == paged_attention.OP:  # our Triton kernel (cuvil_runtime.triton_kernels.paged_attention)
            return paged_attention.extern(reference)
        return reference  # torch's own CUDA kernels: cuBLAS, cuDNN, flash attention

    def out_variant(self, op: str) -> Callable[..., Any]:
        raise KeyError(f"the cuda target lowers no extern into planned buffers ({op})")


def _kernel_flags(exe: Any) -> list[dict[str, Any]]:
    out = []
    for launch in exe._runner.kernels.values():
        out.append({"may_fail": launch.may_fail})
    for subs in exe._runner.regions.values():
        for r in subs:
            out.extend({"may_fail": launch.may_fail} for launch in r.kernels.values())
    return out


@functools.cache
def _hash(code: str, toolchain: str) -> str:
    return hashlib.sha256(f"{code}\n{toolchain}".encode()).hexdigest()


__all__ = ["CudaTarget"]
