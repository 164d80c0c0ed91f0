"""Hand-written attention, ``softmax(q @ kᵀ * s + mask) @ v``, found in the graph and run
as the ``cpu`` target's flash kernel: a Graph IR rewrite before lowering, beside
:mod:`cuvil_backend_cpu.epilogues`.

The chain :func:`rewrite` replaces, every link a value with exactly one user::

    s = matmul(q, kt)                      kt = permute(k, swap the last two) or any kᵀ
    s = div(s, c) | mul(s, c) | mul(c, s)  optional; c a constant number
    s = where(m, -inf, s)                  optional; m bool (masked_fill(m, -inf)), or
        m = bitwise_not(keep)              its keep mask when m is only read here
    s = add(s, a) | add(a, s)              optional; a float mask, broadcast into s
    p = softmax(s, dim=-1)
    o = matmul(p, v)

becomes one ``cpu_attention(q, k, v[, mask])`` node at the last matmul's place. Every
float operand and result is float32, or every one the same half type (float16/bfloat16:
:func:`cuvil_backend_cpu.attention.pattern_extern` runs those by torch's attention in the
type or the composition, measured per shape).

Its reference is that composition, op for op, so anything the kernel does not take
(other batch broadcasting, a short query: :data:`MIN_QUERIES`) runs exactly what eager
runs. The kernel's results differ from eager's by float rounding only (the scale is
applied to q, the softmax is online); one semantic difference is handled: a query
that sees no key is NaN in the composition (softmax of all ``-inf``) and zeros in
``scaled_dot_product_attention``; the kernel gives NaN for this op.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from cuvil_backend_cpu.epilogues import context, same_type, uses
from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.ops._rules import LIBRARY_KERNEL
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

#: fewer queries than this run the composition: the kernel computes a whole tile of
#: queries (16 on AVX2) per block of keys, so a decode step (one query against 512 keys)
#: costs it 1.5x eager's; 8 queries are already 1.15x faster (benchmarks/attention.py's
#: shapes, AVX2 host, docs/cpu-backend.md "Attention")
MIN_QUERIES = 8

_INTERNAL = (
    "an op of the cpu target's own graph rewrite (cuvil_backend_cpu.attention_pattern), made "
    "after capture and never in a captured or exported graph"
)


class PatternAttention(Op):
    """``softmax(scale(q @ kᵀ) [masked] [+ a], -1) @ v``; inputs ``q, k, v[, mask]``.

    ``key_transposed``: the second input is ``kᵀ`` (..., E, S) rather than ``k``;
    ``scale``: ``none``, ``div`` or ``mul`` by ``factor``; ``mask``: ``none``, ``keep``
    (bool, False is ``-inf``), ``drop`` (bool, True is ``-inf``) or ``add`` (float).
    """

    name = "cpu_attention"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL, "mlir": _INTERNAL, "onnx": _INTERNAL}

    @staticmethod
    def infer(
        ctx: ShapeContext,
        q: Type,
        k: Type,
        v: Type,
        *mask: Type,
        key_transposed: bool,
        scale: str,
        factor: float,
        mask_kind: str,
    ) -> Type:
        matmul = REGISTRY.get("matmul")
        kt = k
        if not key_transposed:
            assert isinstance(k, TensorType) and k.rank >= 2
            perm = (*range(k.rank - 2), k.rank - 1, k.rank - 2)
            kt = k.replace(shape=tuple(k.shape[p] for p in perm))
        scores = matmul.infer(ctx, q, kt)
        assert isinstance(scores, TensorType)
        out = matmul.infer(ctx, scores, v)
        assert isinstance(out, TensorType)
        return out

    @staticmethod
    def reference(
        q: Any, k: Any, v: Any, *mask: Any, key_transposed: bool, scale: str, factor: float, mask_kind: str
    ) -> Any:
        s = q @ (k if key_transposed else k.transpose(-1, -2))
        if scale == "div":
            s = s / factor
        elif scale == "mul":
            s = s * factor
        if mask_kind == "drop":
            s = torch.where(mask[0], float("-inf"), s)
        elif mask_kind == "keep":
            s = torch.where(~mask[0], float("-inf"), s)
        elif mask_kind == "add":
            s = s + mask[0]
        return torch.softmax(s, -1) @ v


def kernel_scale(scale: str, factor: float) -> float:
    """The factor the kernel multiplies q by."""
    return 1.0 / factor if scale == "div" else factor if scale == "mul" else 1.0


# -- the rewrite --------------------------------------------------------------------------------


def _dtype(v: Value) -> DType | None:
    """``v``'s dtype where it is a CPU tensor of float32 or a half type, else ``None``."""
    t = v.type
    if isinstance(t, TensorType) and t.device == "cpu" and t.dtype in (DType.f32, DType.bf16, DType.f16):
        return t.dtype
    return None


def _same(v: Value, like: Value) -> bool:
    """``v`` a CPU float tensor of ``like``'s dtype (float32 or a half type)."""
    d = _dtype(v)
    return d is not None and d == _dtype(like)


def _number(n: Node | None) -> float | None:
    """The value of a ``const`` node holding a finite, nonzero number."""
    if n is None or n.op != "const" or n.inputs:
        return None
    value = n.attr("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value != 0.0 else None


def _swaps_last_two(n: Node) -> bool:
    perm = n.attr("perm")
    if n.op != "permute" or not isinstance(perm, (tuple, list)) or len(perm) < 2:
        return False
    r = len(perm)
    return tuple(perm) == (*range(r - 2), r - 1, r - 2)


def rewrite(graph: Graph) -> Graph:
    """``graph`` with each chain of the module doc replaced by one ``cpu_attention`` node
    (top-level nodes only; the graph itself when there is none). Deterministic."""
    if not any(n.op == "softmax" for n in graph.nodes):
        return graph
    count = uses(graph)
    ctx = context(graph)
    nodes = list(graph.nodes)
    producer = {v.name: i for i, n in enumerate(nodes) for v in n.outputs}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            readers.setdefault(v.name, []).append(i)
    removed: set[int] = set()
    replaced: dict[int, Node] = {}

    def made_by(v: Value) -> tuple[int, Node] | None:
        i = producer.get(v.name)
        return None if i is None or i in removed or i in replaced else (i, nodes[i])

    def only_read_by(v: Value, j: int) -> bool:
        return count[v.name] == 1 and readers.get(v.name) == [j]

    for pi, p in enumerate(nodes):
        if p.op != "softmax" or pi in removed or _dtype(p.output) is None or not _same(p.inputs[0], p.output):
            continue
        rank = p.output.type.rank  # type: ignore[union-attr]
        if p.attr("dim") not in (rank - 1, -1) or p.attr("dtype") not in (None, "none", _dtype(p.output)):
            continue
        found = _match(p, pi, nodes, ctx, made_by, only_read_by, readers)
        if found is None:
            continue
        chain, node = found
        removed.update(chain[:-1])
        replaced[chain[-1]] = node
    if not replaced:
        return graph
    return graph.replace(nodes=tuple(replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed))


def _match(
    p: Node, pi: int, nodes: list[Node], ctx: ShapeContext, made_by: Any, only_read_by: Any, readers: Any
) -> tuple[list[int], Node] | None:
    """The chain ending in ``p``'s reader (indices, last one the final matmul) and its node."""
    if not only_read_by(p.output, (readers.get(p.output.name) or [-1])[0]):
        return None
    oi = readers[p.output.name][0]
    out = nodes[oi]
    if (
        out.op != "matmul"
        or out.inputs[0] != p.output
        or out.inputs[1] == p.output
        or not _same(out.output, p.output)
    ):
        return None
    chain = [pi, oi]
    mask: list[Value] = []
    mask_kind = "none"
    cur, at = p.inputs[0], pi

    def step(v: Value, j: int) -> tuple[int, Node] | None:
        """``v``'s producer, when ``v`` is read by node ``j`` alone."""
        return made_by(v) if only_read_by(v, j) else None

    link = step(cur, at)
    if link is None:
        return None
    # an additive mask: add(s, a) or add(a, s), a float32, the sum of the scores' type
    if link[1].op == "add" and len(link[1].inputs) == 2 and not link[1].attrs:
        a, b = link[1].inputs
        prev_a, prev_b = step(a, link[0]), step(b, link[0])
        scores_side = [
            (s, m, prev)
            for s, m, prev in ((a, b, prev_a), (b, a, prev_b))
            if prev is not None and prev[1].op in ("matmul", "div", "mul", "where") and s != m
        ]
        if not scores_side:
            return None
        s, m, prev = scores_side[0]
        # (the mask may broadcast into the scores, as a (B, 1, 1, S) padding mask does)
        mt, st = m.type, s.type
        if not (
            _same(m, p.output)
            and isinstance(mt, TensorType)
            and isinstance(st, TensorType)
            and mt.rank <= st.rank
            and same_type(ctx, link[1].output.type, st)
        ):
            return None
        chain.append(link[0])
        mask, mask_kind = [m], "add"
        cur, at, link = s, link[0], prev
    # a boolean mask: where(m, -inf, s), m's own bitwise_not dropped when only read here
    if mask_kind == "none" and link[1].op == "where" and len(link[1].inputs) == 3:
        m, fill, s = link[1].inputs
        fill_node = made_by(fill)
        if (
            fill_node is None
            or fill_node[1].op != "const"
            or fill_node[1].attr("value") != float("-inf")
            or not isinstance(m.type, TensorType)
            or m.type.dtype != DType.bool
            or not same_type(ctx, link[1].output.type, s.type)
        ):
            return None
        chain.append(link[0])
        mask, mask_kind = [m], "drop"
        inverted = made_by(m)
        if inverted is not None and inverted[1].op == "bitwise_not" and only_read_by(m, link[0]):
            chain.append(inverted[0])
            mask, mask_kind = [inverted[1].inputs[0]], "keep"
        cur, at = s, link[0]
        link = step(cur, at)
        if link is None:
            return None
    # the scale: div(s, c), mul(s, c) or mul(c, s), c a constant
    scale, factor = "none", 1.0
    if link[1].op in ("div", "mul") and len(link[1].inputs) == 2:
        a, b = link[1].inputs
        candidates = ((a, b),) if link[1].op == "div" else ((a, b), (b, a))
        for s_side, c_side in candidates:
            const = made_by(c_side)
            c = _number(const[1] if const is not None else None)
            if c is not None and same_type(ctx, link[1].output.type, s_side.type):
                chain.append(link[0])
                scale, factor = link[1].op, c
                cur, at = s_side, link[0]
                link = step(cur, at)
                break
        if link is None:
            return None
    s_node = link[1]
    if s_node.op != "matmul" or s_node.attrs:
        return None
    q, kt = s_node.inputs
    v = out.inputs[1]
    if not all(_same(t, p.output) for t in (q, kt, v)) or not all(t.type.rank >= 2 for t in (q, kt, v)):  # type: ignore[union-attr]
        return None
    chain.append(link[0])
    key, key_transposed = kt, True
    transposer = made_by(kt)
    if transposer is not None and _swaps_last_two(transposer[1]):
        key, key_transposed = transposer[1].inputs[0], False
        if only_read_by(kt, link[0]):
            chain.append(transposer[0])
    chain.sort()
    if chain[-1] != oi:  # (the final matmul is last in program order: it reads p)
        return None
    attrs = {"key_transposed": key_transposed, "scale": scale, "factor": factor, "mask_kind": mask_kind}
    return chain, Node("cpu_attention", (q, key, v, *mask), out.outputs, tuple(attrs.items()), loc=out.loc)
