"""Grouped-query attention without repeated key heads: a Graph IR rewrite before lowering,
beside :mod:`cuvil_backend_cpu.attention_pattern`.

transformers' decoders with fewer key/value heads than query heads (Llama, Mistral,
Qwen2 ...) repeat each key and value head for its group before attention
(``repeat_kv``)::

    u = unsqueeze(k, dim=2)                (B, Hk, 1, S, E)
    e = expand(u, [B, Hk, R, S, E])
    r = reshape(e, [B, Hk * R, S, E])      a copy: R times the cache, every layer, every step
    o = sdpa(q, r_k, r_v, ...)

(eager transformers skips it for a decode step, ``pack_gqa``, but not while compiling:
``is_torchdynamo_compiling()`` is true during a capture). :func:`rewrite` hands ``sdpa``
the key and value heads themselves, ``sdpa(q, k, v, ..., enable_gqa=True)``: query head
``h`` reads key head ``h // R``, exactly the head ``repeat_kv`` put there (head ``g``
repeated ``R`` times in a row). The repeats are gone when nothing else reads them; the
attention reads each cache row once, in torch's kernel (which handles grouped heads
without copying them) or ours (:mod:`cuvil_backend_cpu.attention`).

Matched only when every size is provably what the chain says (the expand changes only
the new dim, the reshape only merges it into the heads, ``q`` has that many heads), ``k``
and ``v`` are repeated alike, and ``sdpa`` had ``enable_gqa`` off; anything else is left
as it is. What ``sdpa``'s shape rule asks of grouped heads (``q``'s heads divisible by
``k``'s) follows from those sizes and is added to the graph's assumptions in the form the
rule looks for (the guards the call checks are the captured graph's, unchanged).
"""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_backend_cpu.epilogues import context, uses
from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import ShapeContext, canonical


def rewrite(graph: Graph) -> Graph:
    """``graph`` with each ``sdpa`` of repeated key and value heads reading them
    unrepeated (top-level nodes only; the graph itself when there is none)."""
    if not any(n.op == "sdpa" and not n.attr("enable_gqa") for n in graph.nodes):
        return graph
    count = uses(graph)
    ctx = context(graph)
    nodes = list(graph.nodes)
    producer = {v.name: i for i, n in enumerate(nodes) for v in n.outputs}
    removed: set[int] = set()
    replaced: dict[int, Node] = {}
    facts = list(graph.assumptions)
    for i, n in enumerate(nodes):
        if n.op != "sdpa" or n.attr("enable_gqa") or len(n.inputs) < 3:
            continue
        k = _repeated(n.inputs[1], nodes, producer, ctx)
        v = _repeated(n.inputs[2], nodes, producer, ctx)
        q = n.inputs[0].type
        if k is None or v is None or k[1] != v[1] or not isinstance(q, TensorType) or q.rank != 4:
            continue
        qh, kh, vh = q.shape[1], k[0].type.shape[1], v[0].type.shape[1]  # type: ignore[union-attr]
        if not (_equal(ctx, qh, n.inputs[1].type.shape[1], kh * k[1]) and _equal(ctx, kh, vh)):  # type: ignore[union-attr]
            continue
        # sdpa's rule wants keys and values of one batch and length: the repeats' types said
        # so where the sizes are ones the graph knows equal; unrepeated, each has its own
        # (a dynamic cache's past keys and past values are two inputs with two length symbols)
        ks, vs = k[0].type.shape, v[0].type.shape  # type: ignore[union-attr]
        if not (_equal(ctx, ks[0], vs[0]) and _equal(ctx, ks[2], vs[2])):
            continue
        # what sdpa's rule asks of grouped heads, implied by qh = kh * R: said, not assumed anew
        for fact in (canonical(sympy.Eq(sympy.Mod(qh, kh), 0)),):
            if fact != sympy.true and fact not in facts:
                facts.append(fact)
        attrs = tuple((name, True if name == "enable_gqa" else value) for name, value in n.attrs)
        replaced[i] = Node("sdpa", (n.inputs[0], k[0], v[0], *n.inputs[3:]), n.outputs, attrs, loc=n.loc)
        # the repeats no one reads any more go (each chain is reshape, expand, unsqueeze)
        for value, chain in ((n.inputs[1], k[2]), (n.inputs[2], v[2])):
            count[value.name] -= 1
            for j in chain:
                out = nodes[j].outputs[0]
                if count[out.name] > 0 or j in removed:
                    break
                removed.add(j)
                count[nodes[j].inputs[0].name] -= 1
    if not replaced:
        return graph
    kept = tuple(replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed)
    return graph.replace(nodes=kept, assumptions=tuple(facts))


def _repeated(
    r: Value, nodes: list[Node], producer: dict[str, int], ctx: ShapeContext
) -> tuple[Value, Any, list[int]] | None:
    """``(k, R, chain)`` when ``r`` is ``reshape(expand(unsqueeze(k, 2)))`` repeating each
    of ``k``'s heads ``R`` times (``chain``: the three nodes' indices, reshape first)."""
    ri = producer.get(r.name)
    if ri is None or nodes[ri].op != "reshape":
        return None
    ei = producer.get(nodes[ri].inputs[0].name)
    if ei is None or nodes[ei].op != "expand":
        return None
    ui = producer.get(nodes[ei].inputs[0].name)
    if ui is None or nodes[ui].op != "unsqueeze" or nodes[ui].attr("dim") not in (2, -4):
        return None
    k = nodes[ui].inputs[0]
    e_type, r_type = nodes[ei].outputs[0].type, r.type
    if not all(isinstance(t, TensorType) for t in (k.type, e_type, r_type)):
        return None
    assert (
        isinstance(k.type, TensorType) and isinstance(e_type, TensorType) and isinstance(r_type, TensorType)
    )
    if k.type.rank != 4 or e_type.rank != 5 or r_type.rank != 4:
        return None
    (b, h, s, d), (eb, eh, rep, es, ed), (rb, rh, rs, rd) = k.type.shape, e_type.shape, r_type.shape
    same = _equal(ctx, b, eb, rb) and _equal(ctx, h, eh) and _equal(ctx, s, es, rs) and _equal(ctx, d, ed, rd)
    if not (same and _equal(ctx, rh, h * rep)):
        return None
    return k, rep, [ri, ei, ui]


def _equal(ctx: ShapeContext, first: Any, *others: Any) -> bool:
    """Sizes provably equal under the graph's assumptions (no new assumption)."""
    return all(
        first == o
        or ctx.prove(sympy.Eq(first, o)) is True
        or canonical(sympy.Eq(first, o)) in ctx.assumptions
        for o in others
    )
