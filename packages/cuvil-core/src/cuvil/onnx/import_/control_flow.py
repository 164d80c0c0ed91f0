"""Control flow: ``If`` and ``Loop``.

An ``If`` whose condition is known when importing (a constant or a size predicate) is
inlined, the branch chosen now (a size predicate becomes an assumption of the graph);
any other ``If`` is an ``if`` node. A ``Loop`` with a known trip count whose body passes
its condition on is a ``for``; any other ``Loop`` is a ``while`` carrying the condition
(and the iteration number when needed) next to the loop-carried values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy

from cuvil.onnx.import_.folding import Known, known_scalar, to_dim
from cuvil.onnx.import_.loader import Importer, OnnxImportError, dtype_of, rank, register
from cuvil_ir.graph_ir.nodes import Block, Node, Value
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import symbol


def _predicate(im: Importer, name: str) -> Value:
    """A 0-d bool tensor holding the truth of one-element value ``name``."""
    v = im.tensor(name)
    t = v.type
    if not isinstance(t, TensorType):
        raise OnnxImportError(f"condition {name!r} is not a tensor ({t})")
    if t.dtype != DType.bool:
        v = im.emit("cast", [v], dtype=DType.bool)
    if t.rank:
        v = im.emit("reshape", [v], shape=())
    return v


def _check_carried(node: Any, what: str, got: Sequence[Value], want: Sequence[Type]) -> None:
    from cuvil_ir.graph_ir.verifier import types_equal

    for i, (v, t) in enumerate(zip(got, want)):
        if not types_equal(v.type, t):
            raise OnnxImportError(
                f"{node.op_type} node {node.name!r}: {what} #{i} has type {v.type}, expected {t} "
                "(loop-carried values must keep their type)"
            )


def _uses(g: Any, name: str) -> bool:
    """Does subgraph ``g`` (or one nested in it) read the value ``name``?"""
    for n in g.node:
        if name in n.input:
            return True
        for a in n.attribute:
            if a.HasField("g") and _uses(a.g, name):
                return True
            if any(_uses(sub, name) for sub in a.graphs):
                return True
    return name in {o.name for o in g.output}


def _passes_through(g: Any, src: str, dst: str) -> bool:
    """Is ``dst`` in subgraph ``g`` the value ``src`` (through Identity nodes) or a constant true?"""
    producers = {o: n for n in g.node for o in n.output}
    seen = 0
    while dst != src and seen < 64:
        n = producers.get(dst)
        if n is None:
            return False
        if n.op_type == "Identity":
            dst = n.input[0]
        elif n.op_type == "Constant":
            from onnx import numpy_helper

            vals = [numpy_helper.to_array(a.t) for a in n.attribute if a.name == "value"]
            return len(vals) == 1 and vals[0].size == 1 and bool(vals[0].reshape(-1)[0])
        else:
            return False
        seen += 1
    return dst == src


@register("If")
def _if_node(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    then_g, else_g = attrs["then_branch"], attrs["else_branch"]
    c = known_scalar(im.maybe_known(ins[0]))
    if c is not None:
        # Known when importing (a constant or a size predicate): the branch is chosen
        # now; a size predicate becomes an assumption of the graph (another call whose
        # sizes decide it the other way builds another graph).
        if isinstance(c, sympy.Basic) and not isinstance(c, (sympy.logic.boolalg.BooleanAtom)):
            if isinstance(c, sympy.Expr):
                c = sympy.Ne(c, 0)
            taken = im.ctx.decide(c, f"If node {node.name!r}: the branch taken")
        else:
            taken = bool(c)
        return im.inline(then_g if taken else else_g)
    pred = _predicate(im, ins[0])
    then_nodes, then_res = im.block(then_g, {})
    else_nodes, else_res = im.block(else_g, {})
    if len(then_res) != len(else_res):
        raise OnnxImportError(f"the branches yield {len(then_res)} and {len(else_res)} values")
    from cuvil_ir.graph_ir.verifier import types_equal

    for i, (a, b) in enumerate(zip(then_res, else_res)):
        if not types_equal(a.type, b.type):
            raise OnnxImportError(
                f"output #{i}: the branches yield different types {a.type} and {b.type} "
                "(a tensor condition needs branches of one type)"
            )
    outs = tuple(im.fresh(v.type) for v in then_res)
    regions = (Block((), then_nodes, tuple(then_res)), Block((), else_nodes, tuple(else_res)))
    im.nodes.append(Node("if", (pred,), outs, (), regions))
    return list(outs)


@register("Loop")
def _loop_node(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    body = attrs["body"]
    m_name = ins[0] if ins else ""
    c_name = ins[1] if len(ins) > 1 else ""
    carried = ins[2:]
    b_ins = [i.name for i in body.input]
    b_outs = [o.name for o in body.output]
    if len(b_ins) != 2 + len(carried) or len(b_outs) < 1 + len(carried):
        raise OnnxImportError(
            f"the body takes {len(b_ins)} inputs and yields {len(b_outs)} outputs for {len(carried)} "
            "loop-carried values"
        )
    if len(b_outs) > 1 + len(carried):
        scans = [o for o in node.output[len(carried) :] if o] or b_outs[1 + len(carried) :]
        raise OnnxImportError(f"scan outputs {scans} are not supported (only loop-carried values)")
    init = [im.tensor(c) for c in carried]
    trips = known_scalar(im.maybe_known(m_name)) if m_name else None
    cond_true = not c_name or known_scalar(im.maybe_known(c_name)) is True
    if trips is not None and cond_true and _passes_through(body, b_ins[1], b_outs[0]):
        return _as_for(im, node, body, trips, init)
    return _as_while(im, node, body, m_name, c_name, init)


def _as_for(im: Importer, node: Any, body: Any, trips: Any, init: list[Value]) -> list[Value]:
    """``Loop(M, true)`` whose body passes the condition on: ``for i in range(M)``."""
    b_ins = [i.name for i in body.input]
    types = [v.type for v in init]
    if isinstance(trips, sympy.Basic):
        trips = to_dim(sympy.simplify(trips))
    if isinstance(trips, int):
        trips = max(trips, 0)  # a negative trip count runs no iteration
    if isinstance(trips, sympy.Basic) and not trips.is_integer:
        raise OnnxImportError(f"the trip count {trips} is not an integer size expression")
    im.counter += 1
    var = symbol(f"onnx_loop{im.counter}")
    assert im.ctx.hints is not None
    im.ctx.hints[var] = 0
    im.ctx.local_symbols[var] = (0, trips - 1)
    args = [im.fresh(t) for t in types]
    bind: dict[str, Value | Known] = {
        b_ins[0]: Known(np.array(var, dtype=object), DType.i64),
        b_ins[1]: Known(np.array(True), DType.bool),
    }
    bind.update(zip(b_ins[2:], args))
    try:
        nodes, results = im.block(body, bind)
    finally:
        del im.ctx.local_symbols[var]
    results = results[1:]
    _check_carried(node, "loop-carried output", results, types)
    bounds = [im.emit("const", [], value=b) for b in (0, trips, 1)]
    outs = tuple(im.fresh(t) for t in types)
    im.nodes.append(
        Node(
            "for", (*bounds, *init), outs, (("var", var.name),), (Block(tuple(args), nodes, tuple(results)),)
        )
    )
    return list(outs)


def _as_while(im: Importer, node: Any, body: Any, m_name: str, c_name: str, init: list[Value]) -> list[Value]:
    """Any other ``Loop``: a ``while`` carrying the condition (and the iteration number
    when the body reads it or a trip count bounds the loop) next to the values."""
    b_ins = [i.name for i in body.input]
    counted = bool(m_name) or _uses(body, b_ins[0])
    i64, bool_t = TensorType(DType.i64, (), im.device), TensorType(DType.bool, (), im.device)
    pre: list[Value] = []
    if counted:
        pre.append(im.emit("full", [], shape=(), value=0, dtype=DType.i64, device=im.device))
    if c_name:
        pre.append(_predicate(im, c_name))
    else:
        pre.append(im.emit("full", [], shape=(), value=True, dtype=DType.bool, device=im.device))
    trips = _trip_tensor(im, m_name) if m_name else None
    n_pre = len(pre)
    types: list[Type] = [v.type for v in pre] + [v.type for v in init]
    assert types[n_pre - 1] == bool_t and (not counted or types[0] == i64)

    # condition: the carried condition (and the counter below the trip count)
    cargs = [im.fresh(t) for t in types]
    saved = im.nodes
    im.nodes = []
    try:
        pred = cargs[n_pre - 1]
        if trips is not None:
            below = im.emit("lt", [cargs[0], trips])
            pred = im.emit("logical_and", [pred, below])
        cond_block = Block(tuple(cargs), tuple(im.nodes), (pred,))
    finally:
        im.nodes = saved

    # body: the ONNX body, then the counter + 1
    bargs = [im.fresh(t) for t in types]
    bind: dict[str, Value | Known] = {b_ins[1]: bargs[n_pre - 1]}
    if counted:
        bind[b_ins[0]] = bargs[0]
    bind.update(zip(b_ins[2:], bargs[n_pre:]))
    nodes, results = im.block(body, bind)
    saved = im.nodes
    im.nodes = list(nodes)
    try:
        nxt = [_coerce_pred(im, results[0])]
        if counted:
            one = im.emit("full", [], shape=(), value=1, dtype=DType.i64, device=im.device)
            nxt.insert(0, im.emit("add", [bargs[0], one]))
        nxt += results[1:]
        body_block = Block(tuple(bargs), tuple(im.nodes), tuple(nxt))
    finally:
        im.nodes = saved
    _check_carried(node, "loop-carried output", nxt[n_pre:], types[n_pre:])
    outs = tuple(im.fresh(t) for t in types)
    im.nodes.append(Node("while", (*pre, *init), outs, (), (cond_block, body_block)))
    return list(outs[n_pre:])


def _trip_tensor(im: Importer, name: str) -> Value:
    """The trip count ``name`` as a 0-d int64 tensor."""
    v = im.tensor(name)
    if dtype_of(v) != DType.i64:
        v = im.emit("cast", [v], dtype=DType.i64)
    if rank(v):
        v = im.emit("reshape", [v], shape=())
    return v


def _coerce_pred(im: Importer, v: Value) -> Value:
    """The body's condition output as a 0-d bool tensor (the carried condition's type)."""
    if dtype_of(v) != DType.bool:
        v = im.emit("cast", [v], dtype=DType.bool)
    if rank(v):
        v = im.emit("reshape", [v], shape=())
    return v


__all__: list[str] = []
