"""The schedule of a column reduction (``x.sum(0)``: the reduced dimension is not
innermost in memory): the reduction loop outside, the output row as the accumulator."""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_backend_cpu.loop_ir.access import access_offsets, affine, ceil_div
from cuvil_backend_cpu.loop_ir.function import loop_func
from cuvil_backend_cpu.loop_ir.nodes import Loop, LoopFunc, Stmt, Store
from cuvil_backend_cpu.loop_ir.schedule_policy import SchedulePolicy, may_parallelize
from cuvil_backend_cpu.loop_ir.statements import Names, cse, init_value
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram

_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


def column_reduction(
    kernel: Kernel,
    program: TensorProgram,
    policy: SchedulePolicy,
    phases: list[tuple[E.Var, E.Reduce, E.Expr]],
    store_expr: E.Expr,
    domain: list[sympy.Expr],
    syms: list[sympy.Symbol],
    store_off: sympy.Expr,
    names: Names,
) -> LoopFunc | None:
    """A reduction over a dimension that is not innermost in memory (``x.sum(0)``),
    scheduled with the reduction loop outside: the output row is the accumulator.

    Hoisting it instead would make every output element walk its column with a
    stride. Here each tile of ``tile_size`` outputs is initialised, then every
    reduced row adds its contiguous slice into it (a vector loop), then the
    epilogue (``/ n`` of a mean) runs in place. Tiles of outputs are independent,
    so they are the parallel loop.
    """
    buf = program.buffers[kernel.buf]
    if len(phases) != 1 or buf.order is not None or policy.tile_size <= 1:
        return None
    acc, r, body = phases[0]
    live = [(s, e) for s, e in zip(syms, domain) if e != 1]
    if not live or r.kind not in _COMBINE or r.dtype != buf.dtype:
        return None
    j, ej = live[-1]
    rsym = r.ranges[-1][0]
    forms = [affine(sympy.expand(o), [j, rsym]) for o in access_offsets(body)]
    if any(f is None for f in forms):
        return None
    # only accesses that vary with the output index decide (a per-row scalar does not)
    varying = [f for f in forms if f is not None and f.get(j, 0) != 0]
    if not any(f.get(j) == 1 and f.get(rsym, 0) not in (0, 1) for f in varying):
        return None
    if any(f.get(rsym) == 1 for f in varying):
        return None  # the reduced dimension is contiguous somewhere: the row schedule is better
    size = policy.tile_size
    jt = E.tile_symbol(int(j.name[2:]))
    zero = {s: sympy.Integer(0) for s, e in zip(syms, domain) if e == 1}
    off = sympy.expand(store_off.xreplace(zero))
    here = E.Load(kernel.buf, off, buf.dtype)

    def over_tile(stmt: Store) -> Loop:
        kind = "vec" if policy.vectorize else "seq"
        return Loop(j, sympy.Min(ej, jt * size + size), kind, (stmt,), start=jt * size)

    update = E.Call(_COMBINE[r.kind], (here, E.substitute(body, zero)), buf.dtype)
    nest: list[Stmt] = [over_tile(Store(kernel.buf, off, init_value(r.kind, r.dtype)))]
    inner: list[Stmt] = [over_tile(Store(kernel.buf, off, update))]
    for s, ext in reversed(r.ranges):
        inner = [Loop(s, sympy.sympify(ext), "seq", tuple(inner))]
    nest.extend(inner)
    epilogue = E.substitute(E.replace(store_expr, acc, here), zero)
    if epilogue != here:
        lets, expr = cse(epilogue, names)
        nest.append(
            over_tile(Store(kernel.buf, off, expr))
            if not lets
            else Loop(
                j,
                sympy.Min(ej, jt * size + size),
                "seq",
                (*lets, Store(kernel.buf, off, expr)),
                start=jt * size,
            )
        )
    loops = [*live[:-1], (jt, ceil_div(ej, size))]
    work: Any = sympy.Integer(1)
    for _, e in live:
        work = work * e
    for _, e in r.ranges:
        work = work * e
    work = sympy.expand(work)
    stmts: list[Stmt] = nest
    for idx_, (s, ext) in reversed(list(enumerate(loops))):
        kind = "par" if idx_ == 0 and may_parallelize(work, policy) else "seq"
        stmts = [Loop(s, ext, kind, tuple(stmts), work=work if kind == "par" else None)]
    return loop_func(kernel, program, stmts)
