"""Static memory planning: every temporary buffer of a program gets an arena slot.

Lifetimes come from step order: a temporary lives from the kernel that writes it
to the last step that reads it. Walking the steps, a new temporary takes the slot
of a dead one when that slot is provably at least as large (sizes are compared
symbolically, under the graph's assumptions); when the comparison is undecidable
the slot grows to ``Max(old, new)``, which is evaluated at run time. A kernel may
write in place over a temporary it reads for the last time when it reads it
only at the element it writes. Offsets are 64-byte aligned; the program's arena
is the sum of its slots, one allocation per program and size binding. A temporary
whose size is computed from tensor data (``u0``, bound by an extern step when it
runs) has no slot: the runner allocates it when it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sympy

from cuvil_ir.graph_ir.unbacked import Binding, defined_symbols
from cuvil_ir.symbolic import dim_str, prove
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import Control, Extern, Kernel, Step, TensorProgram, View
from cuvil_ir.tensor_ir.values import idx, known_sizes, strided_offset

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    #: bytes: the largest of these (more than one only when sympy could not compare them)
    sizes: tuple[sympy.Expr, ...]
    buffers: tuple[str, ...]

    @property
    def size(self) -> sympy.Expr:
        if len(self.sizes) == 1:
            return self.sizes[0]
        return sympy.Max(*self.sizes, evaluate=False)


@dataclass(frozen=True)
class MemoryPlan:
    slots: tuple[Slot, ...]
    slot_of: dict[str, int]
    #: the temporaries' aligned bytes added up, as if nothing were reused (for comparison)
    unplanned: sympy.Expr

    @property
    def peak(self) -> sympy.Expr:
        """Bytes the arena needs: its aligned slots added up."""
        total: Any = sympy.Integer(0)
        for slot in self.slots:
            total = total + _aligned(slot.size)
        return total if isinstance(total, sympy.Integer) else sympy.expand(total)

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
    """``step`` reads ``src`` only at the element it writes, in the same element size, and
    computes no reduction.

    A kernel with a reduction may accumulate it in the buffer it writes (the schedule's
    stash: each element's partial sums stored there, then the rest of the expression
    applied), which writes the element before the expression reads the other operands
    there: ``out = sum(...) + src`` in ``src``'s slot read ``src`` after the partial sums
    overwrote it (a wrong result that only showed once a third layer of a cache-like
    program put two temporaries in one slot)."""
    a, b = program.buffers[src], program.buffers[step.buf]
    if a.dtype.torch.itemsize != b.dtype.torch.itemsize or sympy.expand(a.numel - b.numel) != 0:
        return False
    here = strided_offset(b.strides, idx(len(step.domain)))
    for x in E.walk(step.body):
        if isinstance(x, E.Load) and x.buf == src and sympy.expand(x.offset - here) != 0:
            return False
        if isinstance(x, E.Reduce):
            return False
    return True


def _aligned(n: Any) -> sympy.Expr:
    return (
        sympy.sympify(n + ALIGN - 1) // ALIGN * ALIGN
        if not sympy.sympify(n).is_Integer
        else sympy.Integer((int(n) + ALIGN - 1) // ALIGN * ALIGN)
    )


def _at_least(a: sympy.Expr, b: sympy.Expr, known: dict[sympy.Symbol, Any]) -> bool | None:
    """``a >= b`` for all sizes (with the sizes the graph pins down substituted), or None."""
    a, b = a.xreplace(known), b.xreplace(known)
    if a == b:
        return True
    return prove(sympy.Ge(a, b))


def data_sizes(program: TensorProgram) -> dict[str, tuple[Binding, ...]]:
    """Per step (by name), the sizes computed from tensor data it binds when it runs
    (see cuvil_ir.graph_ir.unbacked): only extern calls produce them."""
    bound = set(program.outer_symbols)
    for i in program.inputs:
        if i.is_tensor:
            bound |= {s for d in program.buffers[i.name].shape for s in sympy.sympify(d).free_symbols}
    out: dict[str, tuple[Binding, ...]] = {}
    for step in program.steps:
        if isinstance(step, Extern):
            binds = defined_symbols(step.node, bound)
            if binds:
                out[step.name] = binds
                bound |= {b.symbol for b in binds}
    return out


def plan_program(program: TensorProgram) -> TensorProgram:
    # a temporary sized by data is allocated when it is written: its size is not known
    # when the arena is, at the start of the call
    late = {b.symbol for binds in data_sizes(program).values() for b in binds}
    temps = {
        n
        for n, b in program.buffers.items()
        if b.kind == "temp" and not (sympy.sympify(b.nbytes).free_symbols & late)
    }
    last_use: dict[str, int] = {}
    for k, step in enumerate(program.steps):
        for b in _reads(step):
            last_use[b] = k
    slots: list[Slot] = []
    slot_of: dict[str, int] = {}
    free_at: dict[int, int] = {}  # slot -> step index after which it is free
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
                if any(_at_least(x, need, assumptions) for x in slots[s].sizes):
                    chosen = s
                    break
            if chosen is None and candidates:
                s = candidates[0]
                # undecidable (or smaller): the slot keeps every candidate; run time takes the max
                kept = tuple(x for x in slots[s].sizes if not _at_least(need, x, assumptions))
                slots[s] = replace(slots[s], sizes=tuple(sorted({*kept, need}, key=sympy.default_sort_key)))
                chosen = s
            if chosen is None:
                slots.append(Slot((need,), ()))
                chosen = len(slots) - 1
            slots[chosen] = replace(slots[chosen], buffers=slots[chosen].buffers + (buf,))
            slot_of[buf] = chosen
            free_at[chosen] = last_use.get(buf, k)
        if isinstance(step, Control):
            continue  # region programs plan their own arenas
    unplanned = sympy.Integer(0)
    for b in sorted(temps):
        unplanned = unplanned + _aligned(program.buffers[b].nbytes)
    plan = MemoryPlan(tuple(slots), slot_of, sympy.expand(unplanned))
    program = replace(program, plan=plan)
    return program


__all__ = ["ALIGN", "MemoryPlan", "Slot", "data_sizes", "plan_program", "Extern"]
