"""A float32 ``matmul`` whose inner size is a small constant (at most :data:`MAX_K`)
becomes ``K`` broadcast multiply-adds, a Graph IR rewrite the ``cpu`` target runs before
lowering (after the attention rewrite, which reads matmuls, and before the epilogues)::

    matmul(a, b)  ->  a[..., :, 0:1] * b[..., 0:1, :] + ... + a[..., :, K-1:K] * b[..., K-1:K, :]

Such a product does at most ``K`` multiply-adds per output element, so it is bound by
writing its output, not by arithmetic, and a library call is mostly fixed cost: a
4x3 @ 3x1000 product (the mission's classifier head) took 9.4 µs through
``torch.matmul`` against a few in a generated loop, where it also fuses with what reads
it. Batch dimensions broadcast exactly as matmul's do (elementwise broadcasting over the
leading dimensions); the sum runs in order ``k = 0 .. K-1``, as a dot product does, so
results differ from the library's by float rounding only. Measured:
docs/cpu-backend.md, "Small matrix products".
"""

from __future__ import annotations

from cuvil_backend_cpu.epilogues import context, is_f32, same_type
from cuvil_ir.graph_ir.decompose import Builder, NotDecomposed, Sym
from cuvil_ir.graph_ir.nodes import Graph, Node
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import ShapeContext

#: the largest inner size rewritten (measured: docs/cpu-backend.md)
MAX_K = 8


def rewrite(graph: Graph) -> Graph:
    """``graph`` with every small-``K`` float32 matmul (top-level nodes) written out as
    multiply-adds; the graph itself when there is none. Deterministic."""
    if not any(n.op == "matmul" for n in graph.nodes):
        return graph
    ctx = context(graph)
    out: list[Node] = []
    changed = False
    for n in graph.nodes:
        expanded = _expand(n, ctx) if n.op == "matmul" else None
        if expanded is None:
            out.append(n)
        else:
            out.extend(expanded)
            changed = True
    return graph.replace(nodes=tuple(out)) if changed else graph


def _inner_size(a: TensorType, b: TensorType) -> int | None:
    for d in (b.shape[-2], a.shape[-1]):
        if isinstance(d, int):
            return d
    return None


def _expand(n: Node, ctx: ShapeContext) -> list[Node] | None:
    if len(n.inputs) != 2 or len(n.outputs) != 1 or not all(is_f32(v) for v in (*n.inputs, n.output)):
        return None
    a, b = n.inputs
    ta, tb = a.type, b.type
    assert isinstance(ta, TensorType) and isinstance(tb, TensorType)
    if ta.rank < 2 or tb.rank < 2:
        return None  # (matrix-vector and dot products keep the library call)
    k = _inner_size(ta, tb)
    if k is None or not 1 <= k <= MAX_K:
        return None
    build = Builder(n, ctx)
    try:
        acc: Sym | None = None
        for i in range(k):
            ai = build.op("slice", Sym(build, a), dim=ta.rank - 1, start=i, end=i + 1, step=1)
            bi = build.op("slice", Sym(build, b), dim=tb.rank - 2, start=i, end=i + 1, step=1)
            term = build.op("mul", ai, bi)
            acc = term if acc is None else build.op("add", acc, term)
    except NotDecomposed:
        return None
    assert acc is not None
    if not same_type(ctx, acc.type, n.output.type):
        return None
    *body, last = build.nodes
    return [*body, last.replace(outputs=n.outputs)]
