"""What a captured graph needs from its target, checked before the target compiles it.

A target declares what it can run (:class:`cuvil_runtime.target.Capabilities`);
``cu.compile`` enforces it here, so a target without control flow or extern
calls is never handed a graph it would crash on: the user gets a located
:class:`~cuvil.errors.CompileError` (or, with ``fallback="eager"``, the eager
call and a warning saying why).
"""

from __future__ import annotations

from collections.abc import Iterator

import sympy

from cuvil.errors import CompileError, SourceLoc
from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.unbacked import defined_symbols
from cuvil_ir.symbolic import symbol
from cuvil_runtime.target import Capabilities


def _nodes(nodes: tuple[Node, ...]) -> Iterator[Node]:
    for n in nodes:
        yield n
        for r in n.regions:
            yield from _nodes(r.nodes)


def _where(n: Node) -> SourceLoc | None:
    return SourceLoc(n.loc.file, n.loc.line, n.loc.col - 1) if n.loc is not None else None


def _condition(n: Node, producers: dict[Value, Node]) -> Node:
    """The node that computes the condition of a control-flow node (where the user's
    ``if``/``while`` test is), else the node itself."""
    if n.op == "if" and n.inputs and n.inputs[0] in producers:
        return producers[n.inputs[0]]
    if n.op == "while" and n.regions and n.regions[0].results and n.regions[0].results[0] in producers:
        return producers[n.regions[0].results[0]]
    return n


def check_capabilities(graph: Graph, caps: Capabilities, target: str) -> None:
    """Raise a :class:`CompileError` at the first node ``target`` cannot run."""
    producers = {v: n for n in _nodes(graph.nodes) for v in n.outputs}
    data_sized = set() if caps.data_dependent_sizes else _data_sized(graph)
    for n in _nodes(graph.nodes):
        if n.regions and not caps.control_flow:
            raise CompileError(
                f"target {target!r} cannot run control flow that depends on tensor values or sizes "
                f"({n.op!r} in the captured graph)",
                _where(_condition(n, producers)),
                hint="pick a target with control flow (`cuvil backends -v` lists them), make the "
                "condition a Python value, or use fallback='eager'",
            )
        if not caps.extern_calls and "opaque" in REGISTRY.get(n.op).traits:
            what = n.attr("target")
            raise CompileError(
                f"target {target!r} cannot run extern torch calls, and this call has no Cuvil op"
                f"{f' ({what})' if what else ''}",
                _where(n),
                hint="pick a target with extern calls (`cuvil backends -v` lists them), or use fallback='eager'",
            )
        if not caps.data_dependent_sizes and n in data_sized:
            raise CompileError(
                f"target {target!r} cannot run code whose sizes are computed from tensor data",
                _where(n),
                hint="pick a target that can (`cuvil backends -v` lists them), or use fallback='eager'",
            )


def _data_sized(graph: Graph) -> set[Node]:
    """The nodes that bind a size computed from tensor data (cuvil_ir.graph_ir.unbacked)."""
    out: set[Node] = set()

    def visit(nodes: tuple[Node, ...], bound: set[sympy.Symbol]) -> None:
        bound = set(bound)
        for n in nodes:
            inner = bound | ({symbol(str(n.attr("var")))} if n.op == "for" else set())
            for r in n.regions:
                visit(r.nodes, inner)
            binds = defined_symbols(n, bound)
            if binds:
                out.add(n)
                bound |= {b.symbol for b in binds}

    visit(graph.nodes, set(graph.symbols))
    return out


__all__ = ["check_capabilities"]
