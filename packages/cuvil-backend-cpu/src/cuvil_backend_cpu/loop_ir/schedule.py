"""Tensor IR kernel -> Loop IR function: hoist reductions, collapse, parallelize, vectorize.

Passes, in order (each small; the backend's :class:`SchedulePolicy` is data):

1. **hoist** -- the kernel's domain splits at depth ``k``: the outer indices are
   those the reductions vary with. Every distinct ``Reduce`` becomes an
   accumulator computed in its own loop at depth ``k`` (children before parents),
   so a row's max, sum and store share one outer iteration: softmax is one loop
   nest. Tensor IR already realized the reductions this would recompute.
2. **collapse** -- adjacent loops that every access walks contiguously
   (``coeff(i_j) == coeff(i_j+1) * extent(i_j+1)`` in every offset) merge into one.
3. **parallelize / vectorize** -- the outermost loop runs on threads when the
   kernel's work reaches ``parallel_threshold``; the innermost loop of each nest
   is a SIMD loop (with reduction clauses for accumulators).
4. **cse** -- a subexpression used twice in one statement is computed once (``let``).
5. **prefetch** -- a row loop with reduction phases prefetches its next row.

This module drives them for a row schedule (:func:`schedule_kernel`) and for every
kernel of a program (:func:`schedule_program`). The parts live by job: the policy in
``schedule_policy``, the access analysis and loop-shape rewrites (collapse, tile) in
``access``, the per-statement work (cse, invariant hoisting, the stash, prefetches) in
``statements``, the column-reduction schedule in ``column_schedule``, and the Loop IR
function's signature in ``function``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_backend_cpu.loop_ir.access import access_offsets, collapse, in_layout_order, outer_extent, tile
from cuvil_backend_cpu.loop_ir.column_schedule import column_reduction
from cuvil_backend_cpu.loop_ir.function import loop_func
from cuvil_backend_cpu.loop_ir.nodes import Accumulate, Let, Loop, LoopFunc, Scratch, Stmt, Store
from cuvil_backend_cpu.loop_ir.schedule_policy import SchedulePolicy, may_parallelize
from cuvil_backend_cpu.loop_ir.statements import (
    Names,
    cse,
    find_stash,
    hoist_invariants,
    init_value,
    prefetches,
    reads_own,
    sub_e,
)
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.hoist import hoist_depth, postorder_reduces
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram


def schedule_kernel(kernel: Kernel, program: TensorProgram, policy: SchedulePolicy) -> LoopFunc:
    names = Names()
    domain = [sympy.sympify(d) for d in kernel.domain]
    n = len(domain)
    syms = [E.index_symbol(j) for j in range(n)]
    k = hoist_depth(kernel.body)

    # 1. hoist: one accumulator per distinct Reduce, children first
    reds = postorder_reduces(kernel.body)
    acc: dict[E.Reduce, E.Var] = {}

    def replace_reduces(x: E.Expr) -> E.Expr:
        return E.transform(x, lambda y: acc.get(y) if isinstance(y, E.Reduce) else None)

    phases: list[tuple[E.Var, E.Reduce, E.Expr]] = []
    for r in reds:
        body = replace_reduces(r.body)
        v = E.Var(names("acc"), r.dtype)
        acc[r] = v
        acc[E.Reduce(r.kind, body, r.ranges, r.dtype)] = v  # the form seen once inner ones are replaced
        phases.append((v, r, body))
    store_expr = replace_reduces(kernel.body)
    strides = [sympy.sympify(x) for x in program.buffers[kernel.buf].strides]
    store_off = sympy.expand(sum((s * st for s, st in zip(syms, strides)), sympy.Integer(0)))

    column = column_reduction(kernel, program, policy, phases, store_expr, domain, syms, store_off, names)
    if column is not None:
        return column

    # 2. order the outer loops and the inner loops by the store's strides (a channels-last
    #    output walks channels innermost), then collapse outer loops (all accesses in every
    #    phase) and inner loops (the store's accesses)
    order = program.buffers[kernel.buf].order
    outer = in_layout_order(list(zip(syms[:k], domain[:k])), order)
    inner = in_layout_order(list(zip(syms[k:], domain[k:])), order)
    all_offsets = [store_off, *access_offsets(store_expr)] + [
        o for _, _, b in phases for o in access_offsets(b)
    ]
    opaque = frozenset(s for _, r, _ in phases for s, _ in r.ranges)  # (never collapsed with outer)
    subst: dict[sympy.Symbol, Any] = {s: sympy.Integer(0) for s, e in outer + inner if e == 1}
    outer = [(s, e) for s, e in outer if e != 1]
    inner = [(s, e) for s, e in inner if e != 1]
    all_offsets = [o.xreplace(subst) for o in all_offsets]
    if policy.collapse:
        outer, subst1 = collapse(outer, all_offsets, opaque)
        subst = {k: sympy.sympify(v).xreplace(subst1) for k, v in subst.items()} | subst1
        inner_offsets = [o.xreplace(subst) for o in [store_off, *access_offsets(store_expr)]]
        inner, subst2 = collapse(inner, inner_offsets, frozenset())
        subst = {k: sympy.sympify(v).xreplace(subst2) for k, v in subst.items()} | subst2

    def sub(e: E.Expr) -> E.Expr:
        return E.substitute(e, subst) if subst else e

    work: Any = sympy.Integer(1)
    for d in domain:
        work = work * d
    red_work: Any = sympy.Integer(0)
    for _, r, _ in phases:
        w: Any = sympy.Integer(1)
        for _, ext in r.ranges:
            w = w * ext
        red_work = red_work + w
    total = sympy.expand(work + outer_extent(outer) * red_work)

    # 3. build the nest
    def vec_kind(is_innermost: bool) -> str:
        return "vec" if (is_innermost and policy.vectorize) else "seq"

    def reduction_nest(
        v: E.Var, r: E.Reduce, body: E.Expr, top: bool, pre: Sequence[Stmt] = ()
    ) -> list[Stmt]:
        lets, expr = cse(sub(body), names)
        stmts: list[Stmt] = [*pre, *lets, Accumulate(v.name, r.kind, expr)]
        rs = list(r.ranges)
        for j in range(len(rs) - 1, -1, -1):
            s, ext = rs[j]
            kind = vec_kind(j == len(rs) - 1)
            if top and j == 0 and may_parallelize(total, policy):
                kind = "parvec" if len(rs) == 1 and policy.vectorize else "par"
            stmts = [
                Loop(
                    s,
                    sub_e(ext, subst),
                    kind,
                    tuple(stmts),
                    ((v.name, r.kind),),
                    work=total if kind in ("par", "parvec") else None,
                )
            ]
        return [Let(v.name, init_value(r.kind, r.dtype), r.dtype, mutable=True), *stmts]

    store_e = sub(store_expr)
    store_o = sympy.expand(store_off.xreplace(subst))
    stash = find_stash(phases, inner, store_e, kernel, policy, sub) if not reads_own(kernel) else None
    scratch: Scratch | None = None
    level: list[Stmt] = []
    for pi, (v, r, body) in enumerate(phases):
        if stash is not None and stash[0] == pi:
            _, s_r, s_i, rsym, isym = stash
            t = E.Var(names("s"), s_r.dtype)
            body = E.replace(sub(body), s_r, t)
            if s_r.dtype == program.buffers[kernel.buf].dtype:
                keep = Store(kernel.buf, store_o.xreplace({isym: rsym}), t)
                kept: E.Expr = E.Load(kernel.buf, store_o, s_i.dtype)
            else:  # a half output: the float32 value in a row of its own
                scratch = Scratch(names("st"), s_r.dtype, sympy.sympify(inner[0][1]), ())
                keep = Store(scratch.name, rsym, t)
                kept = E.Load(scratch.name, isym, s_i.dtype)
            nest = reduction_nest(v, r, body, top=not outer, pre=[Let(t.name, s_r, t.dtype), keep])
            store_e = E.replace(store_e, s_i, kept)
        else:
            nest = reduction_nest(v, r, body, top=not outer)
        level.extend(nest)
    inner_syms = {s for s, _ in inner}
    hoisted: list[Stmt] = []
    if inner:
        store_e = hoist_invariants(store_e, inner_syms, hoisted, names)
    level.extend(hoisted)
    lets, expr = cse(store_e, names)
    store: list[Stmt] = [*lets, Store(kernel.buf, store_o, expr)]
    ranges = [(s, sympy.Integer(0), ext) for s, ext in inner]
    if not phases and policy.tile_size > 1:
        ranges = tile(ranges, [store_o, *access_offsets(store_e)], policy.tile_size)
    for j in range(len(ranges) - 1, -1, -1):
        s, start, ext = ranges[j]
        kind = vec_kind(j == len(ranges) - 1)
        if not outer and j == 0 and may_parallelize(total, policy):
            kind = "parvec" if len(ranges) == 1 and policy.vectorize else "par"
        store = [
            Loop(s, ext, kind, tuple(store), work=total if kind in ("par", "parvec") else None, start=start)
        ]
    level.extend(store)
    if scratch is not None:
        level = [Scratch(scratch.name, scratch.dtype, scratch.extent, tuple(level))]
    if outer and phases and policy.prefetch:
        level = [*prefetches(phases, outer, kernel, sub), *level]
    for j in range(len(outer) - 1, -1, -1):
        s, ext = outer[j]
        kind = "par" if j == 0 and may_parallelize(total, policy) else "seq"
        level = [Loop(s, ext, kind, tuple(level), work=total if kind == "par" else None)]

    return loop_func(kernel, program, level)


def schedule_program(program: TensorProgram, policy: SchedulePolicy | None = None) -> list[LoopFunc]:
    """Every kernel of ``program`` (nested regions included) as a Loop IR function."""
    policy = policy or SchedulePolicy()
    out = []
    for k in program.kernels():
        owner = _owner(program, k)
        out.append(schedule_kernel(k, owner, policy))
    return out


def _owner(program: TensorProgram, kernel: Kernel) -> TensorProgram:
    from cuvil_ir.tensor_ir.program import Control

    if kernel in program.steps:
        return program
    for s in program.steps:
        if isinstance(s, Control):
            for r in s.regions:
                if kernel in r.kernels():
                    return _owner(r, kernel)
    raise KeyError(kernel.name)


__all__ = ["SchedulePolicy", "schedule_kernel", "schedule_program"]
