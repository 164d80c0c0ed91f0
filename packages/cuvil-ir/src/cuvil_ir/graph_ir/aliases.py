"""Which outputs of a graph are views of its inputs or of its other outputs.

[Note: output aliasing]
Eager PyTorch returns ``x`` itself for ``return x``, a view of ``x``'s storage for
``return x[0]`` / ``x.t()`` / ``x.view(...)``, and one object twice for ``return y, y``,
so an in-place change through one result is seen through the others. Graph IR values
are immutable and have no storage, so the graph says this by its structure alone: an
output whose value is reached from a graph input (or from another output's value)
through view ops only (``"view"`` trait, first operand) *is* that view. The capture
makes this true: a returned value eager gives as a new tensor while the graph would
make it a view (``x.clone()``, ``x.t().contiguous()``) is returned through a ``clone``
node, and a fresh tensor two results are views of is appended as an extra output
(``cuvil/frontend/aliasing.py``).

:func:`output_aliases` reads that structure. A target produces only the outputs it
computes (``computed_graph``) and rebuilds the others per call by running the view
chain's references on the actual input or output tensor (``ProgramRunner``; the
reference executor runs the references anyway): the sizes, strides and storage
offset are eager's for whatever layout the input has, and a ``reshape`` that eager
would copy is copied there too.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import TensorType


@dataclass(frozen=True, slots=True)
class Alias:
    """Output ``of`` the graph is ``chain`` applied to a base: graph input ``index``
    (``base == "input"``) or graph output ``index`` (``base == "output"``: a computed
    output, or an earlier output when the same value is returned twice, with an empty
    chain). Each chain step is (node, which of its outputs)."""

    base: str
    index: int
    chain: tuple[tuple[Node, int], ...]


def output_aliases(graph: Graph) -> tuple[Alias | None, ...]:
    """Per graph output, the :class:`Alias` it is, or None when it is computed."""
    producer: dict[Value, tuple[Node, int]] = {}
    for n in graph.nodes:
        for k, v in enumerate(n.outputs):
            producer[v] = (n, k)
    inputs = {v: i for i, v in enumerate(graph.inputs)}
    bound = set(graph.symbols)
    first: dict[Value, int] = {}
    for i, v in enumerate(graph.outputs):
        first.setdefault(v, i)
    out: list[Alias | None] = []
    for i, v in enumerate(graph.outputs):
        if not isinstance(v.type, TensorType):
            out.append(None)
            continue
        if first[v] != i:  # returned twice: the same tensor object twice, as in eager
            out.append(Alias("output", first[v], ()))
            continue
        chain: list[tuple[Node, int]] = []
        root = v
        while root not in inputs:
            made = producer.get(root)
            if made is None or not _is_view(made[0], bound):
                break
            chain.append(made)
            root = made[0].inputs[0]
        chain.reverse()
        if root in inputs:
            out.append(Alias("input", inputs[root], tuple(chain)))
        elif first.get(root, i) != i:  # a view of a computed output
            out.append(Alias("output", first[root], tuple(chain)))
        else:
            out.append(None)
    return tuple(out)


def computed_graph(graph: Graph, aliases: tuple[Alias | None, ...]) -> Graph:
    """``graph`` returning only its computed outputs, in order (what a target lowers)."""
    if not any(aliases):
        return graph
    return graph.replace(outputs=tuple(v for v, a in zip(graph.outputs, aliases) if a is None))


def _is_view(node: Node, bound: set[sympy.Symbol]) -> bool:
    """A view op on a tensor whose attributes a call can evaluate from its input sizes."""
    if not node.inputs or not isinstance(node.inputs[0].type, TensorType) or node.regions:
        return False
    if "view" not in REGISTRY.get(node.op).traits:
        return False
    return all(_symbols(value) <= bound for _, value in node.attrs)


def _symbols(value: AttrValue) -> set[sympy.Symbol]:
    if isinstance(value, sympy.Basic):
        return {s for s in value.free_symbols if isinstance(s, sympy.Symbol)}
    if isinstance(value, tuple):
        return set().union(*(_symbols(v) for v in value))
    if isinstance(value, KV):
        return set().union(*(_symbols(v) for _, v in value.items))
    return set()


__all__ = ["Alias", "computed_graph", "output_aliases"]
