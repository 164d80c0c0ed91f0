"""Half-precision coverage of a target's fusion policy (issue 30): no float16/bfloat16
tensor forces an extern call where the same float32 program is a kernel.

:func:`extra_externs` captures every corpus program with float32 inputs and again with
its float32 inputs (and a module's parameters) in a half type, lowers both graphs with a
target's :class:`~cuvil_ir.tensor_ir.fusion_policy.FusionPolicy`, and returns, per
program, the extern calls the half program makes that its float32 twin does not (op by
op, counted). A backend's test asserts it is empty: ``tests/test_half_coverage.py`` of
the ``cpu``, ``cuda`` and ``ascend`` packages.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from cuvil.api import compile as cuvil_compile
from cuvil.testing.conformance import in_dtype
from cuvil.testing.corpus import PROGRAMS, Program, instantiate
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
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
        compiled = cuvil_compile(fn, target="reference", fallback="error")
        compiled(*args, **kwargs)
    return compiled.graphs[-1]


def extra_externs(
    policy: FusionPolicy, dtype: torch.dtype
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """``(extra, refused)``: per corpus program, the extern calls its ``dtype`` graph
    lowered with ``policy`` makes beyond its float32 graph's; and the programs eager
    itself refuses in ``dtype`` (with the first line of its error)."""
    extra: dict[str, dict[str, int]] = {}
    refused: dict[str, str] = {}
    for p in PROGRAMS:
        try:
            half = graph_of(p, dtype)
        except (RuntimeError, NotImplementedError) as e:
            refused[p.name] = str(e).splitlines()[0]
            continue
        more = extern_ops(lower(half, policy)) - extern_ops(lower(graph_of(p, None), policy))
        if more:
            extra[p.name] = dict(more)
    return extra, refused


def check(policy: FusionPolicy, dtype: torch.dtype) -> None:
    """Every target's coverage test: no corpus program in ``dtype`` calls torch where its
    float32 twin is a kernel, and eager refuses exactly the programs the corpus says it does."""
    from cuvil.testing.conformance import EAGER_REFUSES

    extra, refused = extra_externs(policy, dtype)
    assert not extra, f"half-precision programs with extern calls their float32 twins lack: {extra}"
    assert set(refused) == set(EAGER_REFUSES), f"eager refused {refused}"


__all__ = ["check", "extern_ops", "extra_externs", "graph_of"]
