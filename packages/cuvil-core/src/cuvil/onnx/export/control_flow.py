"""Control flow: ``if`` becomes ``If``; ``for`` and ``while`` become ``Loop`` (a ``for``
with its trip count computed from its bounds, a ``while`` with its condition evaluated
before the loop and at the end of each iteration). Regions are ONNX subgraphs
(:meth:`~cuvil.onnx.export.exporter.Exporter.subgraph`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil.onnx.export.exporter import Exporter, attr, register
from cuvil_ir.graph_ir.nodes import Block, Node, Value
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, Type


def _pred(ex: Exporter, v: Value) -> str:
    return ex.op("Reshape", [ex.val(v, DType.bool), ex.ints([])])


def _yield(ex: Exporter, block: Block) -> list[tuple[str, Type]]:
    return [(ex.env[r], r.type) for r in block.results]


@register("if")
def _if(ex: Exporter, n: Node) -> Any:
    cond = _pred(ex, n.inputs[0])
    then_b, else_b = n.regions

    def branch(b: Block) -> Callable[[], list[tuple[str, Type]]]:
        def body() -> list[tuple[str, Type]]:
            ex.block(b.nodes)
            return _yield(ex, b)

        return body

    g1 = ex.subgraph(ex.fresh("then"), [], branch(then_b))
    g2 = ex.subgraph(ex.fresh("else"), [], branch(else_b))
    return ex.op("If", [cond], n_out=len(n.outputs), then_branch=g1, else_branch=g2)


@register("for")
def _for(ex: Exporter, n: Node) -> Any:
    start, stop, step, *init = n.inputs
    (body_b,) = n.regions
    s0 = ex.val(start, DType.i64)
    s1 = ex.val(stop, DType.i64)
    st = ex.val(step, DType.i64)
    f64 = DType.f64
    span = ex.cast(ex.op("Sub", [s1, s0]), DType.i64, f64)
    trips = ex.op("Ceil", [ex.op("Div", [span, ex.cast(st, DType.i64, f64)])])
    trips = ex.op("Max", [ex.cast(trips, f64, DType.i64), ex.const(0, DType.i64)])
    var = sympy.Symbol(str(attr(n, "var")), integer=True, nonnegative=True)
    it, cond_in = ex.fresh("iter"), ex.fresh("cond")
    args = [ex.fresh("carry") for _ in body_b.args]

    def body() -> list[tuple[str, Type]]:
        idx = ex.op("Add", [s0, ex.op("Mul", [it, st])])
        ex.scope.syms[var] = ex.op("Reshape", [idx, ex.ints([1])])
        for a, name in zip(body_b.args, args):
            ex.env[a] = name
        ex.block(body_b.nodes)
        return [(cond_in, ScalarType(ScalarKind.bool)), *_yield(ex, body_b)]

    ins: list[tuple[str, Type]] = [(it, ScalarType(ScalarKind.int)), (cond_in, ScalarType(ScalarKind.bool))]
    ins += [(name, a.type) for a, name in zip(body_b.args, args)]
    g = ex.subgraph(ex.fresh("for_body"), ins, body)
    outs = ex.op("Loop", [trips, "", *(ex.val(v) for v in init)], n_out=len(n.outputs), body=g)
    return [outs] if len(n.outputs) == 1 else outs


@register("while")
def _while(ex: Exporter, n: Node) -> Any:
    cond_b, body_b = n.regions

    def run_cond(values: Sequence[str]) -> str:
        for a, name in zip(cond_b.args, values):
            ex.env[a] = name
        ex.block(cond_b.nodes)
        return _pred(ex, cond_b.results[0])

    first = run_cond([ex.val(v) for v in n.inputs])
    it, cond_in = ex.fresh("iter"), ex.fresh("cond")
    args = [ex.fresh("carry") for _ in body_b.args]

    def body() -> list[tuple[str, Type]]:
        for a, name in zip(body_b.args, args):
            ex.env[a] = name
        ex.block(body_b.nodes)
        nxt = [ex.env[r] for r in body_b.results]
        c = run_cond(nxt)
        return [(c, ScalarType(ScalarKind.bool)), *_yield(ex, body_b)]

    ins: list[tuple[str, Type]] = [(it, ScalarType(ScalarKind.int)), (cond_in, ScalarType(ScalarKind.bool))]
    ins += [(name, a.type) for a, name in zip(body_b.args, args)]
    g = ex.subgraph(ex.fresh("while_body"), ins, body)
    outs = ex.op("Loop", ["", first, *(ex.val(v) for v in n.inputs)], n_out=len(n.outputs), body=g)
    return [outs] if len(n.outputs) == 1 else outs
