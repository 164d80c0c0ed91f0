"""Dead-code elimination on a captured graph's nodes, run once when capture ends.

Tracing records every call user code makes, including some whose results nobody
uses (a loop condition first evaluated in Python to see whether it is a tensor ...).
:func:`eliminate_dead_code` drops those that are pure; see its docstring for what stays.
"""

from __future__ import annotations

from cuvil_ir.graph_ir.nodes import Block, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY


def eliminate_dead_code(nodes: tuple[Node, ...], live: set[Value], binds: set[int]) -> tuple[Node, ...]:
    """Drop pure nodes whose results nobody uses (a loop condition first evaluated in
    Python to see whether it is a tensor ...); in-place externs, control flow and nodes
    that bind a size later nodes may use (``binds``) stay. ``live`` (the graph's
    outputs) grows by what the kept nodes use."""
    kept: list[Node] = []
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        op = REGISTRY.get(node.op)
        # an extern call that updates nothing in place is a function of its inputs too
        pure = k not in binds and (
            "pure" in op.traits or (node.op == "extern" and node.attr("mutates") is None)
        )
        if pure and not node.regions and not any(v in live for v in node.outputs):
            continue
        live.update(node.inputs)
        for r in node.regions:
            _block_uses(r, live)
        kept.append(node)
    return tuple(reversed(kept))


def _block_uses(block: Block, live: set[Value]) -> None:
    live.update(block.results)
    for node in block.nodes:
        live.update(node.inputs)
        for r in node.regions:
            _block_uses(r, live)


__all__ = ["eliminate_dead_code"]
