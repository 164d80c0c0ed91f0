"""What one binding of a program's size symbols fixes, made once per binding.

A :class:`SizePlan` holds the arena of the memory plan and each planned buffer's
slice of it (and its address), the derived kernel arguments, the extern attributes
and the shapes of outputs whose sizes are expressions: everything of a call that
depends only on the sizes (:func:`make_plan`). The runner keeps a few per thread
(``ProgramRunner.plan``). Also here: the size symbols a program uses
(:func:`program_symbols`) and whether a value uses a size computed from data
(:func:`is_late`, see [Note: sizes from data] in cuvil_runtime.runner).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from cuvil_ir.symbolic import evaluate
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.memory import ALIGN
from cuvil_ir.tensor_ir.program import Extern, Kernel, ScalarRef, TensorProgram, View
from cuvil_runtime.executor import evaluate_attr
from cuvil_runtime.target import Launch


@dataclass
class SizePlan:
    """What one size binding needs: arena buffers and per-step prepared arguments."""

    arena: torch.Tensor
    temps: dict[str, torch.Tensor]
    ptrs: dict[str, int]
    derived: dict[str, tuple[int, ...]]
    attrs: dict[str, dict[str, Any]]
    #: outputs whose sizes or strides are expressions: (shape, strides) per buffer
    alloc: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def make_plan(
    program: TensorProgram,
    kernels: dict[str, Launch],
    late: set[sympy.Symbol],
    alloc_in_plan: Sequence[str],
    b: dict[sympy.Symbol, int],
) -> SizePlan:
    """The plan of ``program`` for the size binding ``b``: its arena and the slices of it
    each planned buffer takes, the derived arguments of ``kernels`` and the extern
    attributes that use no ``late`` size (those are evaluated per call: see [Note: sizes
    from data] in cuvil_runtime.runner), and the shapes and strides of the outputs in
    ``alloc_in_plan``."""
    prog = program
    plan = prog.plan
    offsets = []
    total = 0
    for s in plan.slots:
        offsets.append(total)
        size = max(int(evaluate(x, b)) for x in s.sizes)
        total += (size + ALIGN - 1) // ALIGN * ALIGN
    arena = torch.empty(max(total, 1), dtype=torch.uint8, device=prog.device)
    temps: dict[str, torch.Tensor] = {}
    ptrs: dict[str, int] = {}
    for name, slot in plan.slot_of.items():
        buf = prog.buffers[name]
        shape = tuple(int(evaluate(d, b)) for d in buf.shape)
        n = int(evaluate(buf.nbytes, b))
        t = arena[offsets[slot] : offsets[slot] + n].view(buf.dtype.torch)
        if buf.order is None:
            t = t.view(shape)
        else:
            t = t.as_strided(shape, tuple(int(evaluate(d, b)) for d in buf.strides))
        temps[name] = t
        ptrs[name] = t.data_ptr()
    derived = {
        k: tuple(kernel_value(evaluate(e, b), t) for e, t in launch.derived)
        for k, launch in kernels.items()
        if launch.derived and not is_late(tuple(e for e, _ in launch.derived), late)
    }
    attrs = {}
    for s in prog.steps:
        if isinstance(s, Extern) and not is_late(s.node.attrs, late):
            attrs[s.name] = {k: evaluate_attr(v, b) for k, v in s.node.attrs}
    alloc = {
        name: (
            tuple(int(evaluate(d, b)) for d in buf.shape),
            tuple(int(evaluate(d, b)) for d in buf.strides),
        )
        for name in alloc_in_plan
        for buf in (prog.buffers[name],)
    }
    return SizePlan(arena, temps, ptrs, derived, attrs, alloc)


def is_late(x: Any, late: set[sympy.Symbol]) -> bool:
    """``x`` (an expression or attribute tree) uses one of the ``late`` sizes (computed
    from tensor data)."""
    syms: set[sympy.Symbol] = set()
    add_symbols(syms, x)
    return bool(syms & late)


def add_symbols(syms: set[sympy.Symbol], x: Any) -> None:
    if isinstance(x, sympy.Basic):
        syms.update(s for s in x.free_symbols if isinstance(s, sympy.Symbol))
    elif isinstance(x, tuple):
        for y in x:
            add_symbols(syms, y)
    elif hasattr(x, "items") and not isinstance(x, dict):
        for _, y in x.items:
            add_symbols(syms, y)


def kernel_value(v: Any, kind: str) -> Any:
    return float(v) if kind == "float" else int(v)


def program_symbols(program: TensorProgram) -> tuple[sympy.Symbol, ...]:
    """Every size symbol the program's sizes, kernels and attributes use, sorted by name."""
    syms: set[sympy.Symbol] = set()

    def add(x: Any) -> None:
        if isinstance(x, sympy.Basic):
            syms.update(s for s in x.free_symbols if isinstance(s, sympy.Symbol) and not E.is_loop_symbol(s))
        elif isinstance(x, tuple):
            for y in x:
                add(y)
        elif hasattr(x, "items") and not isinstance(x, dict):
            for _, y in x.items:
                add(y)

    for b in program.buffers.values():
        add(tuple(b.shape))
    for s in program.steps:
        if isinstance(s, Kernel):
            add(tuple(s.domain))
            for x in E.walk(s.body):
                if isinstance(x, E.Load):
                    add(x.offset)
                elif isinstance(x, E.Index):
                    add(x.expr)
                elif isinstance(x, E.Reduce):
                    add(tuple(n for _, n in x.ranges))
        else:
            for o in s.inputs:
                if isinstance(o, View):
                    add((*o.shape, *o.strides, o.offset))
                elif isinstance(o, ScalarRef) and isinstance(o.value, E.Index):
                    add(o.value.expr)
            for _, v in s.node.attrs:
                add(v)
    for out in program.outputs:
        if isinstance(out, E.Index):
            add(out.expr)
    add(tuple(program.outer_symbols))
    return tuple(sorted(syms, key=lambda s: s.name))
