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
5. **prefetch** -- a row loop with reduction phases prefetches its next row (``_prefetches``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from cuvil_backend_cpu.loop_ir.nodes import Accumulate, Let, Loop, LoopFunc, Param, Prefetch, Stmt, Store
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.hoist import hoist_depth, postorder_reduces
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram


@dataclass(frozen=True)
class SchedulePolicy:
    #: elements of work below which a kernel stays on one thread
    parallel_threshold: int = 32768
    #: collapse contiguous loops into one
    collapse: bool = True
    #: vectorize innermost loops
    vectorize: bool = True
    #: let a reduction phase keep a costly value in the output for the store (see _find_stash)
    stash: bool = True
    #: block size of the tiling pass for transposing accesses (1: no tiling)
    tile_size: int = 32
    #: a row kernel (reduction phases inside an outer loop) prefetches its next row (see _prefetches)
    prefetch: bool = True


def _sym(x: Any) -> sympy.Expr:
    return sympy.sympify(x)


class _Names:
    def __init__(self) -> None:
        self.n = Counter[str]()

    def __call__(self, kind: str) -> str:
        k = self.n[kind]
        self.n[kind] += 1
        return f"{kind}{k}"


_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def _init(kind: str, dtype: DType) -> E.Expr:
    if kind in ("max", "min"):
        if dtype.is_floating:
            return E.Const(float("-inf") if kind == "max" else float("inf"), dtype)
        import torch

        info = torch.iinfo(dtype.torch) if dtype != DType.bool else None
        if info is None:
            return E.Const(kind == "min", dtype)
        return E.Const(info.min if kind == "max" else info.max, dtype)
    v = _IDENTITY[kind]
    return E.Const(bool(v) if dtype == DType.bool else (float(v) if dtype.is_floating else int(v)), dtype)


#: calls whose later operands are evaluated only conditionally -> how many operands run always
_CONDITIONAL = {"where": 1, "and": 1, "or": 1}


def _cse(stmt_expr: E.Expr, names: _Names) -> tuple[list[Let], E.Expr]:
    """Compute each call that occurs more than once in ``stmt_expr`` once, as a ``let``.

    Only what is evaluated unconditionally is counted: the arms of ``where`` and the
    second operand of ``and``/``or`` run only when their condition allows (``c ? a : b``
    and ``&&`` in C). A ``let`` runs on every iteration, so hoisting a load from an arm
    would read out of bounds exactly where the condition guards it (a pad's
    ``x[i - 1]`` at ``i = 0``: a crash on an empty input).
    """
    counts: Counter[E.Expr] = Counter()

    def count(x: E.Expr) -> None:
        counts[x] += 1
        if counts[x] == 1:
            children = list(E.children(x))
            if isinstance(x, E.Call) and x.fn in _CONDITIONAL:
                children = children[: _CONDITIONAL[x.fn]]
            for c in children:
                count(c)

    count(stmt_expr)
    lets: list[Let] = []
    bound: dict[E.Expr, E.Var] = {}

    def rebuild(x: E.Expr) -> E.Expr:
        if x in bound:
            return bound[x]
        if isinstance(x, E.Call):
            y: E.Expr = E.Call(x.fn, tuple(rebuild(a) for a in x.args), x.dtype)
        else:
            y = x
        if counts[x] > 1 and isinstance(x, (E.Call, E.Load)):
            v = E.Var(names("t"), x.dtype)
            lets.append(Let(v.name, y, x.dtype))
            bound[x] = v
            return v
        return y

    return lets, rebuild(stmt_expr)


def _collapse(
    loops: list[tuple[sympy.Symbol, sympy.Expr]], exprs: list[sympy.Expr], opaque: frozenset[sympy.Symbol]
) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], dict[sympy.Symbol, Any]]:
    """Merge adjacent loops (outer j, inner j+1) whose every access is contiguous across them.

    Returns the new loops and a substitution to apply to all offsets (the outer
    symbol becomes 0, the inner one walks the product extent).
    """
    subst: dict[sympy.Symbol, Any] = {}
    loops = list(loops)
    # each distinct offset once, as {loop symbol: coefficient}; None: not affine in the loops
    syms = [s for s, _ in loops]
    forms = [_affine(off, syms) for off in dict.fromkeys(sympy.expand(o) for o in exprs)]
    j = len(loops) - 2
    while j >= 0:
        (a, ea), (b, eb) = loops[j], loops[j + 1]
        ok = a not in opaque and b not in opaque
        for form in forms if ok else ():
            if form is None:
                ok = False
                break
            ca, cb = form.get(a, 0), form.get(b, 0)
            if sympy.expand(ca - cb * eb) != 0:
                ok = False
                break
        if ok:
            # b now walks a*eb + b: its coefficient stays, a's disappears
            for form in forms:
                if form is not None:
                    form.pop(a, None)
            subst = {k: v.xreplace({a: 0}) if isinstance(v, sympy.Basic) else v for k, v in subst.items()}
            subst[a] = sympy.Integer(0)
            loops[j] = (b, sympy.expand(ea * eb))
            del loops[j + 1]
        j -= 1
    return loops, subst


def _affine(off: sympy.Expr, syms: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, Any] | None:
    """``off`` as ``{sym: coefficient}`` over ``syms`` when it is affine in them (else None)."""
    out: dict[sympy.Symbol, Any] = {}
    wanted = set(syms)
    for term in sympy.Add.make_args(off):
        if not (term.free_symbols & wanted):
            continue
        coeff, dep = term.as_independent(*wanted, as_Add=False)
        if dep not in wanted:
            return None
        out[dep] = out.get(dep, 0) + coeff
    return out


def _offsets(e: E.Expr) -> list[sympy.Expr]:
    out = []
    for x in E.walk(e):
        if isinstance(x, E.Load):
            out.append(_sym(x.offset))
        elif isinstance(x, E.Index):
            out.append(_sym(x.expr))
    return out


def schedule_kernel(kernel: Kernel, program: TensorProgram, policy: SchedulePolicy) -> LoopFunc:
    names = _Names()
    domain = [_sym(d) for d in kernel.domain]
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
    strides = [_sym(x) for x in program.buffers[kernel.buf].strides]
    store_off = sympy.expand(sum((s * st for s, st in zip(syms, strides)), sympy.Integer(0)))

    column = _column_reduction(kernel, program, policy, phases, store_expr, domain, syms, store_off, names)
    if column is not None:
        return column

    # 2. order the outer loops and the inner loops by the store's strides (a channels-last
    #    output walks channels innermost), then collapse outer loops (all accesses in every
    #    phase) and inner loops (the store's accesses)
    order = program.buffers[kernel.buf].order
    outer = _in_order(list(zip(syms[:k], domain[:k])), order)
    inner = _in_order(list(zip(syms[k:], domain[k:])), order)
    all_offsets = [store_off, *_offsets(store_expr)] + [o for _, _, b in phases for o in _offsets(b)]
    opaque = frozenset(s for _, r, _ in phases for s, _ in r.ranges)  # (never collapsed with outer)
    subst: dict[sympy.Symbol, Any] = {s: sympy.Integer(0) for s, e in outer + inner if e == 1}
    outer = [(s, e) for s, e in outer if e != 1]
    inner = [(s, e) for s, e in inner if e != 1]
    all_offsets = [o.xreplace(subst) for o in all_offsets]
    if policy.collapse:
        outer, subst1 = _collapse(outer, all_offsets, opaque)
        subst = {k: sympy.sympify(v).xreplace(subst1) for k, v in subst.items()} | subst1
        inner_offsets = [o.xreplace(subst) for o in [store_off, *_offsets(store_expr)]]
        inner, subst2 = _collapse(inner, inner_offsets, frozenset())
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
    total = sympy.expand(work + _outer_extent(outer) * red_work)

    # 3. build the nest
    def vec_kind(is_innermost: bool) -> str:
        return "vec" if (is_innermost and policy.vectorize) else "seq"

    def reduction_nest(
        v: E.Var, r: E.Reduce, body: E.Expr, top: bool, pre: Sequence[Stmt] = ()
    ) -> list[Stmt]:
        lets, expr = _cse(sub(body), names)
        stmts: list[Stmt] = [*pre, *lets, Accumulate(v.name, r.kind, expr)]
        rs = list(r.ranges)
        for j in range(len(rs) - 1, -1, -1):
            s, ext = rs[j]
            kind = vec_kind(j == len(rs) - 1)
            if top and j == 0 and _big(total, policy):
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
        return [Let(v.name, _init(r.kind, r.dtype), r.dtype, mutable=True), *stmts]

    store_e = sub(store_expr)
    store_o = sympy.expand(store_off.xreplace(subst))
    stash = _find_stash(phases, inner, store_e, kernel, policy, sub) if not _reads_own(kernel) else None
    level: list[Stmt] = []
    for pi, (v, r, body) in enumerate(phases):
        if stash is not None and stash[0] == pi:
            _, s_r, s_i, rsym, isym = stash
            t = E.Var(names("s"), s_r.dtype)
            body = E.replace(sub(body), s_r, t)
            nest = reduction_nest(
                v,
                r,
                body,
                top=not outer,
                pre=[Let(t.name, s_r, t.dtype), Store(kernel.buf, store_o.xreplace({isym: rsym}), t)],
            )
            store_e = E.replace(store_e, s_i, E.Load(kernel.buf, store_o, s_i.dtype))
        else:
            nest = reduction_nest(v, r, body, top=not outer)
        level.extend(nest)
    inner_syms = {s for s, _ in inner}
    hoisted: list[Stmt] = []
    if inner:
        store_e = _hoist_invariants(store_e, inner_syms, hoisted, names)
    level.extend(hoisted)
    lets, expr = _cse(store_e, names)
    store: list[Stmt] = [*lets, Store(kernel.buf, store_o, expr)]
    ranges = [(s, sympy.Integer(0), ext) for s, ext in inner]
    if not phases and policy.tile_size > 1:
        ranges = _tile(ranges, [store_o, *_offsets(store_e)], policy.tile_size)
    for j in range(len(ranges) - 1, -1, -1):
        s, start, ext = ranges[j]
        kind = vec_kind(j == len(ranges) - 1)
        if not outer and j == 0 and _big(total, policy):
            kind = "parvec" if len(ranges) == 1 and policy.vectorize else "par"
        store = [
            Loop(s, ext, kind, tuple(store), work=total if kind in ("par", "parvec") else None, start=start)
        ]
    level.extend(store)
    if outer and phases and policy.prefetch:
        level = [*_prefetches(phases, outer, kernel, sub), *level]
    for j in range(len(outer) - 1, -1, -1):
        s, ext = outer[j]
        kind = "par" if j == 0 and _big(total, policy) else "seq"
        level = [Loop(s, ext, kind, tuple(level), work=total if kind == "par" else None)]

    return _func(kernel, program, level)


def _func(kernel: Kernel, program: TensorProgram, body: Sequence[Stmt]) -> LoopFunc:
    """The kernel's Loop IR function: buffers read (``in``), the one written (``out``,
    ``inout`` when also read), and the sizes and scalar arguments the body uses."""
    reads = E.buffers_read(kernel.body)
    params = [Param(b, program.buffers[b].dtype, "in") for b in sorted(reads - {kernel.buf})]
    role = "inout" if kernel.buf in reads else "out"
    params.append(Param(kernel.buf, program.buffers[kernel.buf].dtype, role))
    sizes: set[sympy.Symbol] = set()
    args: dict[str, DType] = {}
    _collect(body, sizes, args)
    return LoopFunc(
        kernel.name,
        tuple(params),
        tuple(sorted(sizes, key=lambda s: s.name)),
        tuple(sorted(args.items())),
        tuple(body),
    )


def _in_order(
    loops: list[tuple[sympy.Symbol, Any]], rank_order: tuple[int, ...] | None
) -> list[tuple[sympy.Symbol, Any]]:
    """``loops`` (over ``_i<d>``) outermost-first in the store buffer's layout ``rank_order``."""
    if rank_order is None:
        return loops
    pos = {d: p for p, d in enumerate(rank_order)}
    return sorted(loops, key=lambda lp: pos[int(lp[0].name[2:])])


_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


def _column_reduction(
    kernel: Kernel,
    program: TensorProgram,
    policy: SchedulePolicy,
    phases: list[tuple[E.Var, E.Reduce, E.Expr]],
    store_expr: E.Expr,
    domain: list[sympy.Expr],
    syms: list[sympy.Symbol],
    store_off: sympy.Expr,
    names: _Names,
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
    forms = [_affine(sympy.expand(o), [j, rsym]) for o in _offsets(body)]
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
    nest: list[Stmt] = [over_tile(Store(kernel.buf, off, _init(r.kind, r.dtype)))]
    inner: list[Stmt] = [over_tile(Store(kernel.buf, off, update))]
    for s, ext in reversed(r.ranges):
        inner = [Loop(s, sympy.sympify(ext), "seq", tuple(inner))]
    nest.extend(inner)
    epilogue = E.substitute(E.replace(store_expr, acc, here), zero)
    if epilogue != here:
        lets, expr = _cse(epilogue, names)
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
    loops = [*live[:-1], (jt, _ceil_div(ej, size))]
    work: Any = sympy.Integer(1)
    for _, e in live:
        work = work * e
    for _, e in r.ranges:
        work = work * e
    work = sympy.expand(work)
    stmts: list[Stmt] = nest
    for idx_, (s, ext) in reversed(list(enumerate(loops))):
        kind = "par" if idx_ == 0 and _big(work, policy) else "seq"
        stmts = [Loop(s, ext, kind, tuple(stmts), work=work if kind == "par" else None)]
    return _func(kernel, program, stmts)


def _tile(
    loops: list[tuple[sympy.Symbol, Any, Any]], offsets: Sequence[sympy.Expr], size: int
) -> list[tuple[sympy.Symbol, Any, Any]]:
    """Tile the innermost loop ``b`` with a loop ``a`` when an access walks ``a``
    contiguously but ``b`` with a stride (a transposing copy): both run in ``size``
    blocks, so each block of the strided operand is read from cache, not memory.

    ``[.., a, .., b]`` becomes ``[.., ta, .., tb, a in [ta*size, min(ea, ta*size+size)), b ...]``.
    """
    if len(loops) < 2:
        return loops
    b, _, eb = loops[-1]
    syms = [s for s, _, _ in loops]
    forms = [f for f in (_affine(sympy.expand(o), syms) for o in offsets) if f is not None]
    pick = None
    for j in range(len(loops) - 2, -1, -1):
        a = loops[j][0]
        if any(f.get(a) == 1 and f.get(b, 0) not in (0, 1) for f in forms):
            pick = j
            break
    if pick is None:
        return loops
    a, _, ea = loops[pick]
    ta, tb = E.tile_symbol(int(a.name[2:])), E.tile_symbol(int(b.name[2:]))
    out = [
        (ta, sympy.Integer(0), _ceil_div(ea, size)) if k == pick else lp for k, lp in enumerate(loops[:-1])
    ]
    out.append((tb, sympy.Integer(0), _ceil_div(eb, size)))
    out.append((a, ta * size, sympy.Min(ea, ta * size + size)))
    out.append((b, tb * size, sympy.Min(eb, tb * size + size)))
    return out


def _ceil_div(n: Any, d: int) -> sympy.Expr:
    n = sympy.sympify(n)
    return sympy.Integer(-(-int(n) // d)) if n.is_Integer else sympy.floor((n + d - 1) / d)


def _reads_own(kernel: Kernel) -> bool:
    return kernel.buf in E.buffers_read(kernel.body)


def _find_stash(
    phases: Sequence[tuple[E.Var, E.Reduce, E.Expr]],
    inner: Sequence[tuple[sympy.Symbol, Any]],
    store_e: E.Expr,
    kernel: Kernel,
    policy: SchedulePolicy,
    sub: Any,
) -> Any:
    """A costly value the store computes that a reduction phase already computed at the
    same element (softmax's ``exp(x - max)``): the phase writes it into the output
    buffer, and the store reads it back instead of computing it again.

    Returns ``(phase index, value over the reduction index, value over the store
    index, reduction symbol, store symbol)`` or ``None``.
    """
    if not policy.stash or len(inner) != 1:
        return None
    isym, iext = inner[0]
    out_dtype = store_e.dtype
    cands = sorted(
        {
            x
            for x in E.walk(store_e)
            if isinstance(x, E.Call) and x.dtype == out_dtype and E.cost(x) >= 4 and isym in E.free_indices(x)
        },
        key=lambda x: (-E.size(x), E.expr_str(x)),
    )
    for pi, (_, r, body) in enumerate(phases):
        if len(r.ranges) != 1:
            continue
        rsym, rext = r.ranges[0]
        if sympy.expand(sympy.sympify(sub_e(rext, {})) - iext) != 0:
            continue
        inside = set(E.walk(sub(body)))
        for c in cands:
            c_r = E.substitute(c, {isym: rsym})
            if c_r in inside:
                return pi, c_r, c, rsym, isym
    return None


def _prefetches(
    phases: Sequence[tuple[E.Var, E.Reduce, E.Expr]],
    outer: Sequence[tuple[sympy.Symbol, Any]],
    kernel: Kernel,
    sub: Any,
) -> list[Prefetch]:
    """Prefetch the next outer iteration's row of every input a reduction phase walks
    contiguously (softmax's, log_softmax's and layer_norm's ``x[i, :]``).

    A row kernel reads its row once from memory (the first phase) and then from cache
    (the later phases and the store). The hardware prefetcher follows a stream only
    inside a 4 KiB page, so each new row starts with cache misses that nothing
    overlaps; fetching row ``i + 1`` while row ``i`` computes (its exp, its normalize)
    overlaps them. Only rows whose offset moves with the innermost outer loop count
    (a weight read by every row stays in cache anyway).
    """
    o, limit = outer[-1]
    outer_syms = {s for s, _ in outer}
    out: dict[tuple[str, sympy.Expr], Prefetch] = {}
    for _, r, body in phases:
        if len(r.ranges) != 1:
            continue
        rsym, rext = r.ranges[0]
        for x in E.walk(sub(body)):
            if not isinstance(x, E.Load) or x.buf == kernel.buf:
                continue
            off = sympy.expand(_sym(x.offset))
            form = _affine(off, [o, rsym])
            if form is None or form.get(rsym) != 1 or form.get(o, 0) == 0:
                continue
            start = sympy.expand(off.xreplace({rsym: sympy.Integer(0), o: o + 1}))
            loop_syms = {s for s in start.free_symbols if E.is_loop_symbol(s)}
            if not loop_syms <= outer_syms:
                continue
            key = (x.buf, start)
            if key not in out:
                out[key] = Prefetch(x.buf, start, sympy.sympify(rext), o, sympy.sympify(limit))
    return [out[k] for k in sorted(out, key=lambda k: (k[0], sympy.srepr(k[1])))]


def _hoist_invariants(e: E.Expr, inner: set[sympy.Symbol], out: list[Stmt], names: _Names) -> E.Expr:
    """Compute once, before the inner loops, every call that does not vary in them
    (``rsqrt(var + eps)`` of a row); ``a / b`` with such a ``b`` becomes ``a * (1 / b)``
    (a multiply is several times cheaper than a divide)."""
    memo: dict[E.Expr, E.Var] = {}

    def hoisted(x: E.Expr) -> E.Var:
        if x not in memo:
            v = E.Var(names("inv"), x.dtype)
            out.append(Let(v.name, x, x.dtype))
            memo[x] = v
        return memo[x]

    def invariant(x: E.Expr) -> bool:
        return isinstance(x, E.Call) and not (E.free_indices(x) & inner)

    def go(x: E.Expr) -> E.Expr:
        if invariant(x):
            return hoisted(x)
        if not isinstance(x, E.Call):
            return x
        if x.fn == "div" and x.dtype.is_floating and not (E.free_indices(x.args[1]) & inner):
            b = x.args[1]
            if not isinstance(b, E.Const):
                return E.Call("mul", (go(x.args[0]), hoisted(E.Call("reciprocal", (b,), b.dtype))), x.dtype)
        return E.Call(x.fn, tuple(go(a) for a in x.args), x.dtype)

    return go(e)


def _outer_extent(outer: Sequence[tuple[sympy.Symbol, sympy.Expr]]) -> Any:
    n: Any = sympy.Integer(1)
    for _, e in outer:
        n = n * e
    return n


def _big(total: sympy.Expr, policy: SchedulePolicy) -> bool:
    """Whether a loop may be parallel: false only when the work is a small constant."""
    t = sympy.sympify(total)
    return not (t.is_Integer and int(t) < policy.parallel_threshold)


def sub_e(e: Any, subst: dict[sympy.Symbol, Any]) -> sympy.Expr:
    return sympy.sympify(e).xreplace(subst) if subst else sympy.sympify(e)


def _collect(stmts: Sequence[Stmt], sizes: set[sympy.Symbol], args: dict[str, DType]) -> None:
    def syms_of(x: Any) -> None:
        for s in sympy.sympify(x).free_symbols:
            if isinstance(s, sympy.Symbol) and not E.is_loop_symbol(s):
                sizes.add(s)

    def expr(e: E.Expr) -> None:
        for x in E.walk(e):
            if isinstance(x, E.Load):
                syms_of(x.offset)
            elif isinstance(x, E.Index):
                syms_of(x.expr)
            elif isinstance(x, E.Arg):
                args[x.name] = x.dtype

    for s in stmts:
        if isinstance(s, Loop):
            syms_of(s.extent)
            syms_of(s.start)
            if s.work is not None:
                syms_of(s.work)
            _collect(s.body, sizes, args)
        elif isinstance(s, (Let, Accumulate)):
            expr(s.expr)
        elif isinstance(s, Store):
            syms_of(s.offset)
            expr(s.expr)
        elif isinstance(s, Prefetch):
            syms_of(s.offset)
            syms_of(s.extent)
            syms_of(s.limit)


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
