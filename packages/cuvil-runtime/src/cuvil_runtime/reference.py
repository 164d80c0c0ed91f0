"""The built-in ``reference`` target: every op's eager torch reference, op by op.

It is registered by this distribution's ``cuvil.backends`` entry point, exactly as
a third-party backend would be, and has the lowest priority, so it is chosen
only when nothing faster is available. Loading :data:`BACKEND` imports nothing
heavy; the executor (and torch) are imported when a graph is compiled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_runtime.target import (
    GRAPH_STAGE,
    BackendSpec,
    Capabilities,
    CompileOptions,
    Executable,
    Exported,
)

CAPABILITIES = Capabilities(
    # Reference kernels are plain torch calls, so they run wherever torch does.
    devices=frozenset({"cpu", "cuda", "npu", "meta"}),
    control_flow=True,
    extern_calls=True,
    data_dependent_sizes=True,
)


#: nothing is generated: the graph is the program
STAGES = (GRAPH_STAGE,)


class ReferenceTarget:
    """Compiling is only preparing an :class:`~cuvil_runtime.executor.Interpreter`."""

    name = "reference"
    capabilities = CAPABILITIES
    stages = STAGES

    def hash(self) -> str:
        import cuvil_runtime
        from cuvil_runtime.pipeline import package_hash

        return hashlib.sha256(package_hash(cuvil_runtime).encode()).hexdigest()

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        from cuvil_runtime.executor import Interpreter

        return Interpreter(graph)

    def export(self, graph: Graph, options: CompileOptions) -> Exported:
        return Exported(data=b"", files={}, requires={})


class ReferenceLoader:
    """The graph is the whole artifact: nothing to check, nothing to load."""

    def check(self, requires: Mapping[str, Any]) -> str | None:
        return None

    def load(self, graph: Graph, exported: Exported) -> Executable:
        from cuvil_runtime.executor import Interpreter

        return Interpreter(graph)


BACKEND = BackendSpec(
    name="reference",
    description="runs each op's eager torch reference in order (the correctness oracle)",
    factory=ReferenceTarget,
    priority=0,
    capabilities=CAPABILITIES,
    stages=STAGES,
    loader=ReferenceLoader,
)

__all__ = ["BACKEND", "CAPABILITIES", "ReferenceTarget"]
