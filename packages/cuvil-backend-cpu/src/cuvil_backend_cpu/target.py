"""The ``cpu`` target: its stages, and the hooks the shared Tensor IR pipeline calls.

Everything the ``cpu`` target does that another target would not: its policy
(:mod:`cuvil_backend_cpu.policy`), Loop IR scheduling, C generation, the C
toolchain and kernel cache, and launching a kernel through ctypes (the GIL is
released for the call). Lowering, the program cache, regions, stage texts, dumps
and the per-call runner are :mod:`cuvil_runtime.pipeline`'s.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

import cuvil_backend_cpu
import cuvil_ir
import cuvil_runtime
from cuvil_backend_cpu import (
    attention,
    attention_pattern,
    decode_attention,
    epilogues,
    externs,
    packed_gemm,
    paged_attention,
    quant_linear,
    repeated_heads,
    shared_input_linears,
    small_matmul,
    step_runner,
)
from cuvil_backend_cpu.codegen import C_TYPES, CKernel, generate_c
from cuvil_backend_cpu.declared import CAPABILITIES, STAGES
from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, Library
from cuvil_backend_cpu.loop_ir.nodes import Accumulate, Let, Loop, LoopFunc, Param, Store
from cuvil_backend_cpu.loop_ir.schedule import schedule_kernel
from cuvil_backend_cpu.policy import FUSION, FUSION_NO_HALF, schedule_policy
from cuvil_backend_cpu.toolchain import ToolchainError, export_cpu_flags, export_toolchain
from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.verifier import verify as verify_graph
from cuvil_ir.passes import Pass, Pipeline
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_runtime.pipeline import ProgramExecutable, compile_program, export_program, package_hash
from cuvil_runtime.target import CompileOptions, Exported, Launch, NativeExtern

_CTYPES = {
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "int16_t": ctypes.c_int16,
    "int8_t": ctypes.c_int8,
    "uint8_t": ctypes.c_uint8,
}


class CpuHooks:
    """The ``cpu`` hooks that need no C compiler: shared by the target and by the
    loader of its ahead-of-time artifacts (:mod:`cuvil_backend_cpu.aot`)."""

    name = "cpu"
    capabilities = CAPABILITIES
    stages = STAGES
    #: what a cached program's kernels are made of (plain data for the program cache)
    codec_classes = (CKernel, LoopFunc, Loop, Let, Accumulate, Store, Param)

    def kernel_texts(self, code: CKernel) -> dict[str, str]:
        return {"loop_ir": code.loop_ir, "c": code.source}

    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        if op == paged_attention.OP:
            # (a loaded artifact: the kernel where this host has a C compiler, else the reference)
            return paged_attention.extern(None, reference)
        return externs.implementation(op, reference, channels_last)

    def out_variant(self, op: str) -> Callable[..., Any]:
        if op == quant_linear.OP:
            # (a loaded artifact: the kernel where this host has a C compiler, else the reference)
            return quant_linear.out_variant(None)
        if op == decode_attention.OP:  # (a loaded artifact: this host's kernels, where it has a compiler)
            return decode_attention.out_variant(self._kernels())
        if op == shared_input_linears.LinearGroup.name:  # (its members one at a time)
            return shared_input_linears.out_variant(
                None, self._f32_linear(), self.out_variant(quant_linear.OP)
            )
        return externs.OUT_VARIANTS[op]

    def _f32_linear(self) -> Callable[..., Any]:
        return self.extern("linear", REGISTRY.get("linear").reference, False)

    # -- native runs ([Note: native runs] in cuvil_runtime.native_runs) ----------------------
    def _kernels(self) -> KernelCache | None:
        """The kernel cache the step runner and the hand-written kernels come from (a loaded
        artifact: this host's, where it has a C compiler)."""
        return _host_cache()

    def step_runner(self) -> Callable[[int], int] | None:
        cache = self._kernels()
        return None if cache is None else step_runner.runner(cache)

    def native_extern(self, op: str) -> NativeExtern | None:
        """The C forms of the weight-only linears' GEMV (alone and grouped) and of in-place
        cache writes."""
        cache = self._kernels()
        if cache is None:
            return None
        if op == quant_linear.OP:
            return quant_linear.native(quant_linear.kernel(cache))
        if op == shared_input_linears.LinearGroup.name:
            return shared_input_linears.native(quant_linear.kernel(cache))
        if op == "extern":  # (its calls that overwrite an argument in place: index_copy_)
            return step_runner.in_place_native(cache)
        if op == decode_attention.OP:
            return decode_attention.native(paged_attention.kernel(cache))
        return None


class CpuTarget(CpuHooks):
    def __init__(self, cache: KernelCache | None = None) -> None:
        self.cache = cache if cache is not None else KernelCache()

    # -- the Target contract ------------------------------------------------------------
    def hash(self) -> str:
        """The compiler's own code (cuvil_ir, cuvil_runtime, this package) and the C
        toolchain with its flags and ISA."""
        return _hash(package_hash(cuvil_ir, cuvil_runtime, cuvil_backend_cpu), self.cache.toolchain.identity)

    def compile(self, graph: Graph, options: CompileOptions) -> ProgramExecutable:
        # the graph_ir stage stays the captured graph (the fused ops show in tensor_ir)
        exe = compile_program(self, rewrite(graph, options), options, self._programs())
        exe.graph = graph
        return exe

    def _programs(self) -> Path:
        """The program cache's folder, beside the kernel cache's (the one asked for: when either
        falls back to a private folder, the other decides for itself)."""
        return self.cache.requested.parent / "cpu-programs"

    # -- the KernelBackend hooks ----------------------------------------------------------
    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        """As :class:`CpuHooks`', except attention and paged attention, which run our own kernels
        (built by this target's kernel cache; a loaded artifact, which may have no compiler, runs
        eager's),
        and float32 linears, whose GEMM choice includes our GEMV for few rows."""
        if op == "sdpa":
            return attention.extern(self.cache, reference)
        if op == "linear" and "linear" in externs.FAST_EXTERNS:
            # our GEMV (few rows) and packed GEMM candidates too ([Note: GEMM choice])
            return externs.linear_with_ours(
                quant_linear.f32_gemv(self.cache), packed_gemm.f32_linear(self.cache)
            )
        if op == "cpu_linear_epilogue" and op in externs.FAST_EXTERNS:
            # our packed GEMM with the epilogue in its store, against oneDNN's post-ops
            return externs.linear_epilogue_with_ours(packed_gemm.f32_linear(self.cache))
        if op == "cpu_attention":
            return attention.pattern_extern(self.cache, reference)
        if op == paged_attention.OP:
            return paged_attention.extern(self.cache, reference)
        return super().extern(op, reference, channels_last)

    def out_variant(self, op: str) -> Callable[..., Any]:
        """As :class:`CpuHooks`', except weight-only linears, which run our own kernel built by
        this target's kernel cache, and matmuls, whose GEMM choice includes our packed GEMM for
        a parameter on the right."""
        if op == quant_linear.OP:
            return quant_linear.out_variant(self.cache)
        if op == "matmul":  # a parameter on the right (GPT-2's Conv1D): our packed GEMM a candidate
            return externs.matmul_into_with_ours(packed_gemm.f32_matmul(self.cache))
        if op == shared_input_linears.LinearGroup.name:
            return shared_input_linears.out_variant(
                self.cache, self._f32_linear(), quant_linear.out_variant(self.cache)
            )
        return super().out_variant(op)

    def _kernels(self) -> KernelCache | None:
        return self.cache

    def fusion_policy(self, options: CompileOptions) -> FusionPolicy:
        return FUSION if self.cache.toolchain.half else FUSION_NO_HALF

    def generate(self, kernel: Kernel, program: TensorProgram, options: CompileOptions) -> CKernel:
        policy = schedule_policy(options)
        if policy.tile_size > 1 and policy.tile_size != self.cache.toolchain.tile_size:
            policy = dc_replace(policy, tile_size=self.cache.toolchain.tile_size)  # the level's caches
        func = schedule_kernel(kernel, program, policy)
        slot_of = program.plan.slot_of
        reads = {p.name for p in func.buffers if p.name != kernel.buf}
        in_place = kernel.buf in slot_of and any(slot_of.get(r) == slot_of[kernel.buf] for r in reads)
        return generate_c(
            func,
            simd_math=self.cache.toolchain.simd_math,
            parallel_threshold=policy.parallel_threshold,
            restrict=not in_place,
        )

    def build(self, codes: Sequence[tuple[str, CKernel]], label: str) -> list[Launch]:
        paths = self.cache.build_all([(n, ck.source) for n, ck in codes], label=label)
        return [launch(self.cache.load(path, ck.source, n), ck) for (n, ck), path in zip(codes, paths)]

    # -- ahead-of-time artifacts (the Exporter contract) ------------------------------------
    def export(self, graph: Graph, options: CompileOptions) -> Exported:
        """The program with kernels built for a named ISA level (:func:`export_toolchain`),
        so the artifact runs on any CPU of that level, not only this one."""
        tc = export_toolchain()
        exporter = self if self.cache.toolchain == tc else CpuTarget(KernelCache(tc, self.cache.requested))
        return export_program(exporter, rewrite(graph, options), options, self._programs())

    def binaries(
        self, codes: Sequence[tuple[str, CKernel]], label: str
    ) -> tuple[list[bytes], dict[str, Any]]:
        paths = self.cache.build_all([(n, ck.source) for n, ck in codes], label=label)
        tc = self.cache.toolchain
        requires = {
            "machine": tc.machine,  # (an AArch64 level's built on another machine: aarch64)
            "isa": tc.isa,
            "cpu_flags": list(export_cpu_flags(tc.isa)),
            # libmvec and libm come with glibc, libgomp with the OpenMP runtime package
            "libraries": [lib.removeprefix("-l") for lib in tc.libs] + ["gomp"],
        }
        return [self.cache.verified_bytes(p) for p in paths], requires


#: the target's Graph IR rewrites before lowering, at ``opt_level`` > 0 (docs/cpu-backend.md)
GRAPH_PASSES: Pipeline[Graph] = Pipeline(
    "graph_ir",
    [
        Pass(
            "repeated_heads", repeated_heads.rewrite, "grouped-query attention reads its key heads unrepeated"
        ),
        Pass(
            "decode_attention",
            decode_attention.rewrite,
            "a decode step's attention to the cache kernel, written into its buffer",
        ),
        Pass("attention_pattern", attention_pattern.rewrite, "hand-written attention to the flash kernel"),
        Pass(
            "small_matmul", small_matmul.rewrite, "matrix products with a small inner size to multiply-adds"
        ),
        Pass("epilogues", epilogues.rewrite, "GEMM/convolution epilogues fused, BatchNorm folded"),
        Pass("shared_input_linears", shared_input_linears.rewrite, "linears of one input as one call"),
        Pass(
            "silu_gate",
            shared_input_linears.fuse_silu_gate,
            "a gated MLP's silu(gate) * up into its linear group's call",
        ),
    ],
    verify_graph,
)


def rewrite(graph: Graph, options: CompileOptions) -> Graph:
    """:data:`GRAPH_PASSES` at ``opt_level`` > 0 (none at 0); compiled and exported
    programs alike."""
    if options.opt_level == 0:
        return graph
    return GRAPH_PASSES(graph)


@functools.cache
def _host_cache() -> KernelCache | None:
    """This host's kernel cache, once per process (``None``: no C compiler here)."""
    try:
        return KernelCache()
    except ToolchainError:
        return None


@functools.cache
def _hash(code: str, toolchain: str) -> str:
    return hashlib.sha256(f"{code}\n{toolchain}".encode()).hexdigest()


def launch(lib: Library, ck: CKernel) -> Launch:
    """The kernel's function with argument types set (pointers, int64 sizes, scalars),
    and the order the runner passes them in (buffers as tensors for an emulated kernel,
    which copies them into the emulated process: :mod:`cuvil_backend_cpu.emulation`)."""
    assert ck.func is not None
    fn = lib[ck.name]
    types: list[Any] = [ctypes.c_void_p] * len(ck.func.buffers)
    types += [ctypes.c_int64] * len(ck.func.sizes)
    types += [_CTYPES[t] for _, t in ck.derived]
    types += [_CTYPES[C_TYPES[d]] for _, d in ck.func.args]
    fn.argtypes = types
    fn.restype = ctypes.c_int if ck.may_fail else None
    return Launch(
        fn=fn,
        buffers=tuple(p.name for p in ck.func.buffers),
        sizes=tuple(ck.func.sizes),
        derived=tuple((e, "float" if t == "double" else "int") for e, t in ck.derived),
        scalars=tuple(ck.func.args),
        may_fail=ck.may_fail,
        tensors=isinstance(lib, EmulatedLibrary),
        address=None if isinstance(lib, EmulatedLibrary) else step_runner.address(fn),
    )


__all__ = ["GRAPH_PASSES", "CpuHooks", "CpuTarget", "launch", "rewrite"]
