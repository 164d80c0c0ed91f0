"""Reductions the schedule computes together in one pass over a row, found by matching
Tensor IR shapes: softmax's ``max`` with its ``sum(exp(x - max))`` (online softmax) and a
``sum`` with its sum of squared deviations from the mean (Welford). Each matcher maps
the first reduction of a pair to its partner; :mod:`cuvil_ir.triton_source.schedule`
emits the pair."""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_ir.tensor_ir import expr as E


def prod(xs: Any) -> sympy.Expr:
    out: Any = sympy.Integer(1)
    for x in xs:
        out = out * sympy.sympify(x)
    return out


def online_pairs(reds: list[E.Reduce]) -> dict[E.Reduce, E.Reduce]:
    """Float ``max`` reductions whose softmax sum ``sum(exp(body - max))`` over the same
    extents is also in the kernel: max -> that sum (computed together, one pass)."""
    out: dict[E.Reduce, E.Reduce] = {}
    for sm in reds:
        b = sm.body
        if sm.kind != "sum" or not (isinstance(b, E.Call) and b.fn == "exp"):
            continue
        inner = b.args[0]
        if not (isinstance(inner, E.Call) and inner.fn == "sub" and isinstance(inner.args[1], E.Reduce)):
            continue
        mx = inner.args[1]
        if mx.kind != "max" or not mx.dtype.is_floating or mx.dtype != sm.dtype or mx in out:
            continue
        if [n for _, n in mx.ranges] != [n for _, n in sm.ranges]:
            continue
        renamed = E.substitute(inner.args[0], {s: m for (s, _), (m, _) in zip(sm.ranges, mx.ranges)})
        if renamed == mx.body:
            out[mx] = sm
    return out


def welford_pairs(reds: list[E.Reduce]) -> dict[E.Reduce, E.Reduce]:
    """Float ``sum(x)`` reductions whose sum of squared deviations from the mean,
    ``sum((x - sum(x) / n) * (x - sum(x) / n))`` with ``n`` the number of terms, is also
    in the kernel: the sum -> that one (computed together, one pass)."""
    out: dict[E.Reduce, E.Reduce] = {}
    for sq in reds:
        b = sq.body
        if sq.kind != "sum" or not (isinstance(b, E.Call) and b.fn == "mul" and b.args[0] == b.args[1]):
            continue
        d = b.args[0]
        if not (isinstance(d, E.Call) and d.fn == "sub"):
            continue
        mean = d.args[1]
        if not (isinstance(mean, E.Call) and mean.fn == "div" and isinstance(mean.args[0], E.Reduce)):
            continue
        total, n = mean.args
        assert isinstance(total, E.Reduce)
        if total.kind != "sum" or not total.dtype.is_floating or total.dtype != sq.dtype or total in out:
            continue
        if [x for _, x in total.ranges] != [x for _, x in sq.ranges]:
            continue
        count = sympy.expand(prod(x for _, x in total.ranges))
        if not _is_count(n, count):
            continue
        renamed = E.substitute(d.args[0], {s: t for (s, _), (t, _) in zip(sq.ranges, total.ranges)})
        if renamed == total.body:
            out[total] = sq
    return out


def _is_count(e: E.Expr, count: sympy.Expr) -> bool:
    """``e`` is the number ``count`` as a float (a constant, or a cast size)."""
    if isinstance(e, E.Const):
        return bool(count.is_Integer) and float(e.value) == float(count)
    if isinstance(e, E.Call) and e.fn == "cast" and len(e.args) == 1:
        return _is_count(e.args[0], count)
    if isinstance(e, E.Index):
        return bool(sympy.expand(sympy.sympify(e.expr) - count) == 0)
    return False


__all__ = ["online_pairs", "prod", "welford_pairs"]
