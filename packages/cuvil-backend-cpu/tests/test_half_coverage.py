"""No float16/bfloat16 tensor forces an extern call where the same float32 program is a
kernel (issue 30): every corpus program is captured with float32 inputs and again with
its float32 inputs (and a module's parameters) in each half type, both graphs are lowered
with the ``cpu`` target's fusion policy, and the half program may call torch only where
the float32 one does (op by op, counted). The target's float32-only Graph IR rewrites
(fused GEMM epilogues, hand-written attention, small matrix products) are left out of both
sides: they replace float32 chains by extern calls, which would hide the comparison.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.testing.conformance import EAGER_REFUSES, in_dtype
from cuvil.testing.corpus import PROGRAMS, Program, instantiate
from cuvil_backend_cpu.policy import FUSION
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.tensor_ir.lower import lower
from cuvil_ir.tensor_ir.program import Control, Extern, TensorProgram


def extern_ops(program: TensorProgram) -> Counter[str]:
    """The extern calls of ``program`` and its regions, by op (an ``extern`` by its torch target)."""
    out: Counter[str] = Counter()
    for s in program.steps:
        if isinstance(s, Extern):
            op = s.node.op
            out[op if op != "extern" else f"extern:{s.node.attr('target')}"] += 1
        elif isinstance(s, Control):
            for r in s.regions:
                out += extern_ops(r)
    return out


def graph_of(p: Program, dtype: torch.dtype | None) -> Graph:
    """The Graph IR of ``p``'s first variant, its float32 tensors (and parameters) in ``dtype``."""
    fn: Any = instantiate(p)
    if dtype is not None and p.is_module:
        fn = fn.to(dtype)
    args, kwargs = in_dtype(p.call_args(0), dtype)
    with torch.no_grad():
        fn(*args, **kwargs)  # raises where eager has no kernel for the dtype
        compiled = cu.compile(fn, target="reference", fallback="error")
        compiled(*args, **kwargs)
    return compiled.graphs[-1]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_half_programs_call_torch_only_where_float32_does(dtype: torch.dtype) -> None:
    extra: dict[str, dict[str, int]] = {}
    refused: dict[str, str] = {}
    for p in PROGRAMS:
        try:
            half = graph_of(p, dtype)
        except (RuntimeError, NotImplementedError) as e:
            refused[p.name] = str(e).splitlines()[0]
            continue
        more = extern_ops(lower(half, FUSION)) - extern_ops(lower(graph_of(p, None), FUSION))
        if more:
            extra[p.name] = dict(more)
    assert not extra, f"half-precision programs with extern calls their float32 twins lack: {extra}"
    assert set(refused) == set(EAGER_REFUSES), f"eager refused {refused}"
