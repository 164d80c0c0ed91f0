"""What a lowering rule sees of the lowering in progress: :class:`LoweringContext`.

A rule (:mod:`cuvil_ir.tensor_ir.rules`) is called as ``rule(lowering, node, *operands)``
by :class:`cuvil_ir.tensor_ir.lower.Lowering`, which imports the rules; the rules name
the lowering by this protocol, which sits below both, so no import points back up.
"""

from __future__ import annotations

from typing import Protocol

import sympy

from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.program import Buffer, Step
from cuvil_ir.tensor_ir.values import Lazy


class LoweringContext(Protocol):
    """The part of :class:`~cuvil_ir.tensor_ir.lower.Lowering` rules use."""

    #: what the backend wants (dtypes kernels hold, ops kept as externs, native lowerings)
    policy: FusionPolicy
    #: the graph's size assumptions: rules decide sign and clamp facts under them
    assumptions: tuple[sympy.Basic, ...]
    #: the buffers and steps so far (a composite's lowering undoes a partial attempt)
    buffers: dict[str, Buffer]
    steps: list[Step]

    def realize(self, lz: Lazy, kind: str = "temp", order: tuple[int, ...] | None | str = "auto") -> Lazy:
        """Write ``lz`` into a new buffer with one kernel (unless it already is one)."""
        ...

    def seed(self) -> E.Arg:
        """A fresh random seed, drawn by the runtime once per call."""
        ...

    def reduce_symbol(self) -> sympy.Symbol:
        """A fresh reduction index."""
        ...


__all__ = ["LoweringContext"]
