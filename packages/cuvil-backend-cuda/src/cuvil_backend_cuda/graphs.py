"""CUDA Graphs: a program's launches for one size set, captured once and replayed.

:class:`GraphedExecutable` wraps a compiled program on a GPU. Per size bucket
(the shapes, strides and dtypes of the tensor inputs and the values of the scalar
inputs, which kernels take by value) the first call runs on the stream (warm-up:
Triton compiles, the autotuner measures); the second captures the program into a
``torch.cuda.CUDAGraph`` with static input buffers, and every later call copies
its inputs into them (skipped when an input already is that buffer), replays the
graph and returns copies of the outputs (the graph's own outputs are overwritten
by the next replay; handing them out would be a silent wrong result later).
The memory plan's arena of that size set is the graph's static memory: the graph
keeps the runner's plan alive. At most ``max_graphs`` graphs per program (least
recently used dropped).

A program whose launches are not the same every call runs on the stream always,
and says why in ``notes`` (``stats.notes``): data-dependent control flow (an
``if``/``while`` on a tensor value, read on the host), random numbers (seeds drawn
on the host every call), or an integer division checked for a zero divisor (the
check reads a flag on the host).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import torch

from cuvil_ir.tensor_ir.program import Control, TensorProgram
from cuvil_runtime.pipeline import ProgramExecutable

#: graphs kept per program
MAX_GRAPHS = 8


def graphs_enabled(extra: dict[str, Any]) -> bool:
    """``cu.compile(..., cuda_graphs=False)`` or ``CUVIL_CUDA_GRAPHS=0`` turns them off."""
    if os.environ.get("CUVIL_CUDA_GRAPHS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(extra.get("cuda_graphs", True))


def why_not_graphed(program: TensorProgram, may_fail: bool) -> str | None:
    """Why ``program`` cannot be replayed as one graph; ``None`` when it can."""
    if any(isinstance(s, Control) for s in program.steps):
        return "it has data-dependent control flow (if/for/while read on the host)"
    if program.seeds:
        return "it draws random numbers (a new seed on the host every call)"
    if may_fail:
        return "an integer division checks for a zero divisor on the host"
    return None


class _Graph:
    __slots__ = ("graph", "inputs", "outputs", "keep")

    def __init__(self, graph: Any, inputs: list[Any], outputs: tuple[Any, ...], keep: Any) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.keep = keep


class GraphedExecutable:
    """A :class:`ProgramExecutable` replayed as CUDA Graphs (see the module doc)."""

    def __init__(
        self, inner: ProgramExecutable, enabled: bool, reason: str | None, max_graphs: int = MAX_GRAPHS
    ):
        self.inner = inner
        self.stages = inner.stages
        self.kernel_texts = inner.kernel_texts
        self.report = inner.report
        self.program = inner.program
        self.enabled = enabled and reason is None
        self.max_graphs = max_graphs
        self.notes: list[str] = []
        if not enabled:
            self.notes.append(f"cuda: program {inner.program.name} runs without CUDA Graphs (turned off)")
        elif reason is not None:
            self.notes.append(f"cuda: program {inner.program.name} runs without CUDA Graphs: {reason}")
        self._graphs: OrderedDict[tuple[Any, ...], _Graph] = OrderedDict()
        self._seen: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self._pool: Any = None
        self.replays = 0
        self.captures = 0

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(device):
            if not self.enabled:
                return self.inner(*inputs)
            return self._graphed(inputs)

    def _key(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            (tuple(x.shape), x.stride(), x.dtype, x.device)
            if isinstance(x, torch.Tensor)
            else ("v", type(x), x)
            for x in inputs
        )

    def _graphed(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        key = self._key(inputs)
        with self._lock:
            g = self._graphs.get(key)
            if g is None:
                if key not in self._seen:  # warm-up on the stream: compiles, autotunes
                    self._seen.add(key)
                    return self.inner(*inputs)
                g = self._capture(inputs)
                self._graphs[key] = g
                if len(self._graphs) > self.max_graphs:
                    self._graphs.popitem(last=False)
            else:
                self._graphs.move_to_end(key)
            for static, x in zip(g.inputs, inputs):
                if isinstance(static, torch.Tensor) and static.data_ptr() != x.data_ptr():
                    static.copy_(x)
            g.graph.replay()
            self.replays += 1
            return tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in g.outputs)

    def _capture(self, inputs: tuple[Any, ...]) -> _Graph:
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self.inner(*static)
        # the runner's per-size plans (the arena the graph writes) must outlive the graph
        keep = dict(self.inner._runner._local.__dict__.get("plans", {}))
        self.captures += 1
        return _Graph(graph, static, outputs, keep)


__all__ = ["GraphedExecutable", "graphs_enabled", "why_not_graphed"]
