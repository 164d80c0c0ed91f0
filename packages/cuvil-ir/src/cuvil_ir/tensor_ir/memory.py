"""Static memory planning: every temporary buffer of a program gets an arena slot.

Lifetimes come from step order: a temporary lives from the kernel that writes it
to the last step that reads it. Walking the steps, a new temporary takes the slot
of a dead one when that slot is provably at least as large (sizes are compared
symbolically, under the graph's assumptions); when the comparison is undecidable
the slot grows to ``Max(old, new)``, which is evaluated at run time. A kernel may
write in place over a temporary it reads for the last time when it reads it
only at the element it writes. Offsets are 64-byte aligned; the program's arena
is the sum of its slots, one allocation per program and size binding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sympy

from cuvil_ir.symbolic import dim_str, prove
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import Control, Extern, Kernel, Step, TensorProgram, View

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    size: sympy.Expr  # bytes
    buffers: tuple[str, ...]


@dataclass(frozen=True)
class MemoryPlan:
    slots: tuple[Slot, ...]
    slot_of: dict[str, int]
    #: bytes the arena needs (aligned slots); the temporaries' sum without reuse, for comparison
    peak: sympy.Expr
    unplanned: sympy.Expr

    def __str__(self) -> str:
        lines = ["arena {"]
        for k, s in enumerate(self.slots):
            bufs = ", ".join(f"%{b}" for b in s.buffers)
            lines.append(f"  slot{k}: {dim_str(s.size)} bytes = {bufs}")
        lines.append(f"  peak {dim_str(self.peak)} bytes (without reuse {dim_str(self.unplanned)})")
        lines.append("}")
        return "\n".join(lines)


def _reads(step: Step) -> set[str]:
    if isinstance(step, Kernel):
        return set(E.buffers_read(step.body))
    return {o.buf for o in step.inputs if isinstance(o, View)}


def _writes(step: Step) -> tuple[str, ...]:
    if isinstance(step, Kernel):
        return (step.buf,)
    return step.outputs


def _in_place(step: Kernel, src: str, program: TensorProgram) -> bool:
    """``step`` reads ``src`` only at the element it writes, in the same element size."""
    a, b = program.buffers[src], program.buffers[step.buf]
    if a.dtype.torch.itemsize != b.dtype.torch.itemsize or sympy.expand(a.numel - b.numel) != 0:
        return False
    from cuvil_ir.tensor_ir.lower import idx, linear_offset

    here = linear_offset(step.domain, idx(len(step.domain)))
    for x in E.walk(step.body):
        if isinstance(x, E.Load) and x.buf == src and sympy.expand(x.offset - here) != 0:
            return False
        if isinstance(x, E.Reduce) and src in E.buffers_read(x):
            return False
    return True


def _aligned(n: Any) -> sympy.Expr:
    return (
        sympy.sympify(n + ALIGN - 1) // ALIGN * ALIGN
        if not sympy.sympify(n).is_Integer
        else sympy.Integer((int(n) + ALIGN - 1) // ALIGN * ALIGN)
    )


def _max(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """``Max(a, b)`` without sympy's simplification (slow, and the plan only evaluates it)."""
    args = list(a.args) if isinstance(a, sympy.Max) else [a]
    if b not in args:
        args.append(b)
    return sympy.Max(*sorted(args, key=sympy.default_sort_key), evaluate=False)


def _at_least(a: sympy.Expr, b: sympy.Expr, known: dict[sympy.Symbol, Any]) -> bool | None:
    """``a >= b`` for all sizes (with the sizes the graph pins down substituted), or None."""
    if isinstance(a, sympy.Max):
        return True if any(_at_least(x, b, known) for x in a.args) else None
    if isinstance(b, sympy.Max):
        return True if all(_at_least(a, x, known) for x in b.args) else None
    a, b = a.xreplace(known), b.xreplace(known)
    if a == b:
        return True
    return prove(sympy.Ge(a, b))


def plan_program(program: TensorProgram) -> TensorProgram:
    temps = {n for n, b in program.buffers.items() if b.kind == "temp"}
    last_use: dict[str, int] = {}
    for k, step in enumerate(program.steps):
        for b in _reads(step):
            last_use[b] = k
    slots: list[Slot] = []
    slot_of: dict[str, int] = {}
    free_at: dict[int, int] = {}  # slot -> step index after which it is free
    from cuvil_ir.tensor_ir.lower import known_sizes

    assumptions = known_sizes(program.graph.assumptions)
    for k, step in enumerate(program.steps):
        for buf in _writes(step):
            if buf not in temps:
                continue
            need = program.buffers[buf].nbytes
            candidates = []
            for s, slot in enumerate(slots):
                end = free_at[s]
                if end < k:
                    candidates.append(s)
                elif end == k and isinstance(step, Kernel):
                    src = [b for b in slot.buffers if last_use.get(b) == k]
                    if src and _in_place(step, src[-1], program):
                        candidates.append(s)
            chosen = None
            for s in candidates:  # a slot provably large enough, the smallest such first
                if _at_least(slots[s].size, need, assumptions):
                    chosen = s
                    break
            if chosen is None and candidates:
                s = candidates[0]
                grown = need if _at_least(need, slots[s].size, assumptions) else _max(slots[s].size, need)
                slots[s] = replace(slots[s], size=grown)
                chosen = s
            if chosen is None:
                slots.append(Slot(need, ()))
                chosen = len(slots) - 1
            slots[chosen] = replace(slots[chosen], buffers=slots[chosen].buffers + (buf,))
            slot_of[buf] = chosen
            free_at[chosen] = last_use.get(buf, k)
        if isinstance(step, Control):
            continue  # region programs plan their own arenas
    peak = sympy.Integer(0)
    for slot in slots:
        peak = peak + _aligned(slot.size)
    unplanned = sympy.Integer(0)
    for b in sorted(temps):
        unplanned = unplanned + _aligned(program.buffers[b].nbytes)
    plan = MemoryPlan(tuple(slots), slot_of, sympy.expand(peak), sympy.expand(unplanned))
    program = replace(program, plan=plan)
    return program


__all__ = ["ALIGN", "MemoryPlan", "Slot", "plan_program", "Extern"]
