"""The ``cpu`` target: Graph IR -> Tensor IR -> Loop IR -> C, compiled in parallel, cached.

Registered by this distribution's ``cuvil.backends`` entry point ``cpu``.
Importing this module is cheap; the toolchain probe runs in ``check`` (memoised)
and the compile pipeline is imported when a graph is compiled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_runtime.target import BackendSpec, Capabilities, CompileOptions, Executable

CAPABILITIES = Capabilities(devices=frozenset({"cpu"}), control_flow=True, extern_calls=True)


@dataclass
class CompileReport:
    """What one compile produced (``CpuExecutable.report``)."""

    graph_hash: str
    tensor_ir_hash: str
    loop_ir_hashes: dict[str, str]
    c_hashes: dict[str, str]
    kernels: int
    externs: int
    peak_arena_bytes: str
    cache_hits: int
    cache_misses: int


class CpuExecutable:
    """Runs a compiled program; ``stages`` holds the text of every stage for audit and dumps."""

    def __init__(self, program: Any, runner: Any, stages: dict[str, str], report: CompileReport) -> None:
        self.program = program
        self._runner = runner
        self.stages = stages
        self.report = report

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        # inference: results carry no autograd history (kernels could not record one
        # anyway), and out= extern calls refuse parameters that require grad
        import torch  # (already loaded: keeps importing this spec module cheap)

        with torch.no_grad():
            return self._runner(*inputs)  # type: ignore[no-any-return]


class CpuTarget:
    name = "cpu"
    capabilities = CAPABILITIES

    def __init__(self) -> None:
        from cuvil_backend_cpu.kernel_cache import KernelCache

        self.cache = KernelCache()

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        from cuvil_backend_cpu.compile import compile_graph

        return compile_graph(graph, options, self.cache)


def _check() -> str | None:
    from cuvil_backend_cpu.toolchain import check

    return check()


def dump_dir() -> Path | None:
    d = os.environ.get("CUVIL_DUMP")
    return Path(d) if d else None


BACKEND = BackendSpec(
    name="cpu",
    description="fused C kernels with OpenMP threads and SIMD, built by the system C compiler",
    factory=CpuTarget,
    check=_check,
    install="pip install 'cuvil[cpu]'",
    priority=10,
    capabilities=CAPABILITIES,
)

__all__ = ["BACKEND", "CAPABILITIES", "CompileReport", "CpuExecutable", "CpuTarget"]
