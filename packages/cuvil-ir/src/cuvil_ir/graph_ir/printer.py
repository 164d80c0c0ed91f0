"""Deterministic text form of Graph IR (read back by :mod:`.parser`).

    graph @f(%x: Tensor[f32, (x_0, 16), cpu], %y: Tensor[f32, (16, 4), cpu]) {
      assume Ne(x_0, 1)
      %0 = matmul(%x, %y) : Tensor[f32, (x_0, 4), cpu]
      %1 = const() {value = 1.0} : Scalar[float]
      %2 = add(%0, %1) : Tensor[f32, (x_0, 4), cpu]
      return %2
    }

Graph inputs keep their names; every other value is renumbered in definition
order, so the text does not depend on how a graph was built. Attributes are
sorted by name. Size expressions inside attributes are written ``<expr>``.
"""

from __future__ import annotations

import json
import math

import sympy

from cuvil_ir.graph_ir import nodes as graph_nodes
from cuvil_ir.graph_ir.nodes import KV, AttrValue, Block, Graph, Node, Ref, Value
from cuvil_ir.graph_ir.types import DType, Type
from cuvil_ir.symbolic import dim_str, expr_str


def format_attr(v: AttrValue) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, Ref):
        return f"${v.index}"
    if isinstance(v, KV):
        return "{" + ", ".join(f"{k} = {format_attr(x)}" for k, x in v.items) + "}"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, sympy.Basic):
        return f"<{dim_str(v)}>"  # type: ignore[arg-type, unused-ignore]
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def format_type(t: Type) -> str:
    return str(t)


class _Namer:
    def __init__(self, canonical: bool) -> None:
        self.canonical = canonical
        self.names: dict[Value, str] = {}
        self.next = 0

    def define(self, v: Value, keep: bool = False) -> str:
        if keep or not self.canonical:
            name = v.name
        else:
            name = str(self.next)
            self.next += 1
        self.names[v] = name
        return "%" + name

    def use(self, v: Value) -> str:
        try:
            return "%" + self.names[v]
        except KeyError:
            return f"%<undefined {v.name}>"


def print_graph(g: Graph, *, locations: bool = True, canonical: bool = True) -> str:
    namer = _Namer(canonical)
    params = ", ".join(f"{namer.define(v, keep=True)}: {format_type(v.type)}" for v in g.inputs)
    lines = [f"graph @{g.name}({params}) {{"]
    for a in g.assumptions:
        lines.append(f"  assume {expr_str(a)}")
    _print_nodes(g.nodes, namer, lines, "  ", locations)
    lines.append("  return " + ", ".join(namer.use(v) for v in g.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


graph_nodes.PRINT_GRAPH = print_graph  # Graph.text and str(graph)


def _print_nodes(nodes: tuple[Node, ...], namer: _Namer, lines: list[str], ind: str, locs: bool) -> None:
    for n in nodes:
        operands = ", ".join(namer.use(v) for v in n.inputs)
        head = f"{ind}{', '.join(namer.define(v) for v in n.outputs)} = " if n.outputs else ind
        text = f"{head}{n.op}({operands})"
        if n.attrs:
            text += " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in n.attrs) + "}"
        if n.regions:
            lines.append(text + " (")
            for i, r in enumerate(n.regions):
                _print_block(r, namer, lines, ind + "  ", locs, i)
            text = ind + ")"
        if n.outputs:
            text += " : " + ", ".join(format_type(v.type) for v in n.outputs)
        if locs and n.loc is not None:
            text += f"  loc({json.dumps(n.loc.file)}:{n.loc.line}:{n.loc.col})"
        lines.append(text)


def _print_block(b: Block, namer: _Namer, lines: list[str], ind: str, locs: bool, index: int) -> None:
    args = ", ".join(f"{namer.define(v)}: {format_type(v.type)}" for v in b.args)
    lines.append(f"{ind}^{index}({args}) {{")
    _print_nodes(b.nodes, namer, lines, ind + "  ", locs)
    lines.append(f"{ind}  yield " + ", ".join(namer.use(v) for v in b.results))
    lines.append(f"{ind}}}")
