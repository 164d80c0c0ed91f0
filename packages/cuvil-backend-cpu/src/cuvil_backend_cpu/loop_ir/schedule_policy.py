"""The cpu scheduler's choices as data (:class:`SchedulePolicy`) and the one rule that
reads the work size: whether a loop may run on threads (:func:`may_parallelize`)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class SchedulePolicy:
    #: elements of work below which a kernel stays on one thread
    parallel_threshold: int = 32768
    #: collapse contiguous loops into one
    collapse: bool = True
    #: vectorize innermost loops
    vectorize: bool = True
    #: let a reduction phase keep a costly value in the output for the store (see statements.find_stash)
    stash: bool = True
    #: block size of the tiling pass for transposing accesses (1: no tiling)
    tile_size: int = 32
    #: a row kernel (reduction phases inside an outer loop) prefetches its next row (see statements.prefetches)
    prefetch: bool = True


def may_parallelize(total: sympy.Expr, policy: SchedulePolicy) -> bool:
    """Whether a loop may be parallel: false only when the work is a small constant."""
    t = sympy.sympify(total)
    return not (t.is_Integer and int(t) < policy.parallel_threshold)
