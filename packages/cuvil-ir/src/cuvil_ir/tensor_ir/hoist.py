"""Where a kernel's reductions are computed: the split every scheduler shares.

A kernel's domain splits at depth ``k`` (:func:`hoist_depth`): the outer ``k``
indices are those its reductions vary with, so each distinct ``Reduce`` is
computed once per point of them (children before parents,
:func:`postorder_reduces`) and the inner indices then reuse the results. The
``cpu`` scheduler runs the outer indices on threads; the Triton generator maps
them to a program's rows. :func:`must_realize` is the fusion-policy predicate
that keeps out of a kernel the reductions this split would recompute or get wrong.
"""

from __future__ import annotations

import sympy

from cuvil_ir.tensor_ir import expr as E


def hoist_depth(body: E.Expr) -> int:
    """One more than the deepest output index any reduction of ``body`` varies with
    (0 when the reductions vary with none, or there are none)."""
    pos = [
        int(s.name[2:])
        for r in E.walk(body)
        if isinstance(r, E.Reduce)
        for s in E.free_indices(r)
        if s.name.startswith("_i")
    ]
    has_reduce = any(isinstance(r, E.Reduce) for r in E.walk(body))
    return max(pos, default=-1) + 1 if has_reduce else 0


def must_realize(reduce: E.Reduce, free: frozenset[sympy.Symbol], outer: frozenset[sympy.Symbol]) -> bool:
    """Whether lowering must make ``reduce`` a buffer of its own for a scheduler that
    hoists (``FusionPolicy.realize_reduction``): the hoist computes each reduction once
    per point of the kernel's outer indices, which is right only when the reduction
    varies with every non-unit outer index (``outer``) and with no index of an
    enclosing reduction; any other would be recomputed or wrong."""
    return any(s.name.startswith("_r") for s in free) or not outer <= free


def postorder_reduces(e: E.Expr) -> list[E.Reduce]:
    """The distinct reductions of ``e``, each after the reductions its body uses."""
    out: list[E.Reduce] = []

    def go(x: E.Expr) -> None:
        for c in E.children(x):
            go(c)
        if isinstance(x, E.Reduce) and x not in out:
            out.append(x)

    go(e)
    return out


__all__ = ["hoist_depth", "must_realize", "postorder_reduces"]
