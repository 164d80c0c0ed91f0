"""``CUVIL_DUMP=dir``: every compile writes the text of each stage its target declares.

Files go to ``dir/<graph hash[:12]>/``: ``<stage>.<suffix>`` for every stage the
executable has text for (``graph_ir.txt``, ``tensor_ir.txt`` ... in the target's
order), and for a per-kernel stage also ``kernels/<kernel>.<suffix>``. The names
come from the target's :class:`~cuvil_runtime.target.Stage` list, so a new target's
stages are dumped with no change here.

The IR after every pass goes to ``passes/``: ``NN-<level>-<pass>.txt`` in the
order the passes ran (the target's Graph IR rewrites, lowering's, the Tensor IR
passes: :mod:`cuvil_ir.passes`), so a pass that changed something can be found by
comparing two neighbouring files. On a program-cache hit only the target's Graph IR rewrites run (lowering is skipped).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.passes import tracing
from cuvil_runtime.target import CompileOptions, Executable, Target


def dump_dir() -> Path | None:
    d = os.environ.get("CUVIL_DUMP")
    return Path(d) if d else None


def compile_graph(target: Target, graph: Graph, options: CompileOptions) -> Executable:
    """``target.compile(graph, options)``, writing its stages when ``CUVIL_DUMP`` is set."""
    d = dump_dir()
    if d is None:
        return target.compile(graph, options)
    folder = d / graph.hash[:12]
    with tracing(_PassWriter(folder / "passes")):
        exe = target.compile(graph, options)
    write_stages(folder, target, exe)
    return exe


class _PassWriter:
    """Writes the IR after each pass, numbered in the order they run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0

    def __call__(self, level: str, name: str, ir: Any) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count += 1
        text = getattr(ir, "text", None)
        (self.folder / f"{self.count:02d}-{level}-{name}.txt").write_text(
            text if isinstance(text, str) else str(ir)
        )


def write_stages(folder: Path, target: Target, exe: Executable) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    texts = exe.stages
    per_kernel = exe.kernel_texts
    for stage in target.stages:
        if stage.name in texts:
            (folder / f"{stage.name}.{stage.suffix}").write_text(texts[stage.name])
        if stage.per_kernel:
            for kernel, kt in per_kernel.items():
                if stage.name in kt:
                    (folder / "kernels").mkdir(exist_ok=True)
                    (folder / "kernels" / f"{kernel}.{stage.suffix}").write_text(kt[stage.name])


__all__ = ["compile_graph", "dump_dir", "write_stages"]
