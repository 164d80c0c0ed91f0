"""Which node binds each data-dependent size symbol; see [Note: data-dependent sizes]
in :mod:`cuvil_ir.graph_ir.ops.core`.

Every consumer (verifier, reference executor, Tensor IR runner, memory plan) asks the
same question the same way, so the rule lives here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import symbol


@dataclass(frozen=True, slots=True)
class Binding:
    """``symbol`` is ``outputs[output].shape[dim]`` after the node runs, or, with ``dim``
    None, the node's (scalar) result ``outputs[output]`` itself."""

    symbol: sympy.Symbol
    output: int
    dim: int | None


def defined_symbols(node: Node, bound: Iterable[sympy.Symbol]) -> tuple[Binding, ...]:
    """The symbols ``node`` binds, given the symbols ``bound`` before it: ``bind_size``'s
    ``symbol``, and each result dim of an ``extern`` call (only torch's own kernels make
    such sizes) that is exactly a symbol not bound before; the first such dim binds it."""
    known = set(bound)
    out: list[Binding] = []
    if node.op == "bind_size":
        s = symbol(str(node.attr("symbol")))
        return (Binding(s, 0, None),) if s not in known else ()
    if node.op != "extern":
        return ()
    for k, v in enumerate(node.outputs):
        if not isinstance(v.type, TensorType):
            continue
        for d, size in enumerate(v.type.shape):
            if isinstance(size, sympy.Symbol) and size not in known:
                known.add(size)
                out.append(Binding(size, k, d))
    return tuple(out)


__all__ = ["Binding", "defined_symbols"]
