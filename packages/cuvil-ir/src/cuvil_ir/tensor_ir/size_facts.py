"""What a graph's size facts (``Graph.assumptions``) give lowering.

:func:`specialize` substitutes the sizes they pin down (the Graph IR pass lowering
starts with); :func:`facts_under` gives the facts that hold inside one branch of an
``if`` on a size ([Note: facts of a size branch]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace as dc_replace
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, Block, Graph, Node, Value
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import canonical
from cuvil_ir.tensor_ir.values import as_dim as _dim
from cuvil_ir.tensor_ir.values import known_sizes


def specialize(graph: Graph) -> Graph:
    """``graph`` with every size its assumptions pin down substituted in types and attributes.

    The guards check these facts before a call, so lowering may use them: a dim
    known to be 1 broadcasts, two dims known equal index alike.
    """
    known = known_sizes(graph.assumptions)
    if not known:
        return graph
    values: dict[str, Value] = {}

    def val(v: Value) -> Value:
        if v.name not in values:
            t = v.type
            if isinstance(t, TensorType):
                t = dc_replace(t, shape=tuple(_dim(sympy.sympify(d).xreplace(known)) for d in t.shape))
            values[v.name] = Value(v.name, t)
        return values[v.name]

    def attr(a: Any) -> Any:
        if isinstance(a, sympy.Basic):
            return a.xreplace(known)
        if isinstance(a, tuple):
            return tuple(attr(x) for x in a)
        if isinstance(a, KV):
            return KV(tuple((k, attr(x)) for k, x in a.items))
        return a

    def block(b: Block) -> Block:
        return Block(
            tuple(val(a) for a in b.args), tuple(node(n) for n in b.nodes), tuple(val(r) for r in b.results)
        )

    def node(n: Node) -> Node:
        return Node(
            n.op,
            tuple(val(v) for v in n.inputs),
            tuple(val(v) for v in n.outputs),
            tuple((k, attr(a)) for k, a in n.attrs),
            tuple(block(r) for r in n.regions),
            n.loc,
        )

    inputs = tuple(val(v) for v in graph.inputs)
    nodes = tuple(node(n) for n in graph.nodes)
    # the facts themselves in the new names (``Eq(w1_0, x_1)`` becomes true and goes), so
    # the specialized graph names no symbol its inputs no longer bind; a fact about an
    # expression (``Eq(Mod(x_0*x_1, 2), 0)``) stays as it is
    renamed = {k: v for k, v in known.items() if isinstance(k, sympy.Symbol)}
    # (in canonical form: renaming can turn a fact into another's arguments in the other
    # order, and facts are looked up as written: Eq(k_2 + 1, w + q_1 - 1) with q_1 -> 1)
    facts = tuple(
        canonical(f)
        for f in (sympy.sympify(a).xreplace(renamed) for a in graph.assumptions)
        if f is not sympy.true
    )
    return Graph(graph.name, inputs, nodes, tuple(val(v) for v in graph.outputs), facts)


# [Note: facts of a size branch]
# Facts learnt while tracing a branch of an `if` on a size are recorded conditional on
# it: `Or(Eq(x0_0, 1), Eq(x1_1, 1))` says that under `Ne(x0_0, 1)` (the else branch)
# the dim x1_1 is 1, so `x1 + x0` broadcasts x1 there. The region is lowered (and
# specialized) under the facts that hold in it, or the kernel would index x1_1 as if
# it were x0_0 and read past the end of x1.
def facts_under(assumptions: Sequence[sympy.Basic], cond: sympy.Basic) -> tuple[sympy.Basic, ...]:
    """The assumptions, with each one conditional on ``cond`` resolved, and ``cond``."""
    # canonical() may decide a fact outright (a plain bool): as sympy it stays one value
    c = sympy.sympify(canonical(cond))
    repl = {c: sympy.true, sympy.sympify(canonical(sympy.Not(c))): sympy.false}
    out: list[sympy.Basic] = []
    for a in (*assumptions, c):
        f = sympy.sympify(canonical(sympy.sympify(a).xreplace(repl)))
        if f is sympy.true or f is sympy.false or f in out:
            continue  # false: the branch cannot run, nothing to learn
        out.append(f)
    return tuple(out)


__all__ = ["facts_under", "specialize"]
