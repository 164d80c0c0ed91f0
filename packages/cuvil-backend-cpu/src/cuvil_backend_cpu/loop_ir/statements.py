"""What the scheduler does inside a loop nest, statement by statement.

Fresh local names (:class:`Names`) and accumulators' initial values
(:func:`init_value`); a subexpression used twice in one statement computed once
(:func:`cse`); calls invariant in the inner loops computed before them
(:func:`hoist_invariants`); a reduction phase keeping a costly value in the output for
the store (softmax's ``exp(x - max)``: :func:`find_stash`); a row kernel prefetching its
next row (:func:`prefetches`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_backend_cpu.loop_ir.access import affine
from cuvil_backend_cpu.loop_ir.nodes import Let, Prefetch, Stmt
from cuvil_backend_cpu.loop_ir.schedule_policy import SchedulePolicy
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import Kernel


class Names:
    def __init__(self) -> None:
        self.n = Counter[str]()

    def __call__(self, kind: str) -> str:
        k = self.n[kind]
        self.n[kind] += 1
        return f"{kind}{k}"


_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def init_value(kind: str, dtype: DType) -> E.Expr:
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


def cse(stmt_expr: E.Expr, names: Names) -> tuple[list[Let], E.Expr]:
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


def hoist_invariants(e: E.Expr, inner: set[sympy.Symbol], out: list[Stmt], names: Names) -> E.Expr:
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


def reads_own(kernel: Kernel) -> bool:
    return kernel.buf in E.buffers_read(kernel.body)


def find_stash(
    phases: Sequence[tuple[E.Var, E.Reduce, E.Expr]],
    inner: Sequence[tuple[sympy.Symbol, Any]],
    store_e: E.Expr,
    kernel: Kernel,
    policy: SchedulePolicy,
    sub: Any,
) -> Any:
    """A costly value the store computes that a reduction phase already computed at the
    same element (softmax's ``exp(x - max)``): the phase writes it into the output
    buffer, and the store reads it back instead of computing it again (a half-precision
    output, which cannot hold it unrounded, keeps a float32 one in a ``Scratch`` row).

    Returns ``(phase index, value over the reduction index, value over the store
    index, reduction symbol, store symbol)`` or ``None``.
    """
    if not policy.stash or len(inner) != 1:
        return None
    isym, iext = inner[0]
    out_dtype = store_e.dtype
    # a half output stashes the float32 value it is rounded from (into a Scratch row)
    kinds = {out_dtype, DType.f32} if out_dtype in (DType.f16, DType.bf16) else {out_dtype}
    cands = sorted(
        {
            x
            for x in E.walk(store_e)
            if isinstance(x, E.Call) and x.dtype in kinds and E.cost(x) >= 4 and isym in E.free_indices(x)
        },
        key=lambda x: (-E.size(x), E.expr_str(x)),
    )
    rows = []
    for pi, (_, r, body) in enumerate(phases):
        if len(r.ranges) != 1:
            continue
        rsym, rext = r.ranges[0]
        if sympy.expand(sympy.sympify(sub_e(rext, {})) - iext) != 0:
            continue
        rows.append((pi, rsym, set(E.walk(sub(body)))))
    for c in cands:  # the costliest value first, whichever phase computes it
        for pi, rsym, inside in rows:
            c_r = E.substitute(c, {isym: rsym})
            if c_r in inside:
                return pi, c_r, c, rsym, isym
    return None


def prefetches(
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
            off = sympy.expand(sympy.sympify(x.offset))
            form = affine(off, [o, rsym])
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


def sub_e(e: Any, subst: dict[sympy.Symbol, Any]) -> sympy.Expr:
    return sympy.sympify(e).xreplace(subst) if subst else sympy.sympify(e)
