"""Shape and data-movement ops: reshape, permute, (un)squeeze, expand, repeat, flip,
slice, select, cat, split, embedding (a ``Gather``), tril/triu, pad, and the factories
``full`` and ``arange``. Dims that are size expressions are computed in the model
(:meth:`~cuvil.onnx.export.sizes.SizeExprs.dims`)."""

from __future__ import annotations

from typing import Any

import sympy

from cuvil.onnx.export.builder import INT64_MAX, INT64_MIN, ExportError, onnx_dtype
from cuvil.onnx.export.exporter import Exporter, attr, out_type, python_value, register, tensor_of
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType


@register("reshape")
def _reshape(ex: Exporter, n: Node) -> Any:
    return ex.op("Reshape", [ex.val(n.inputs[0]), ex.dims(attr(n, "shape"))])


@register("permute")
def _permute(ex: Exporter, n: Node) -> Any:
    return ex.op("Transpose", [ex.val(n.inputs[0])], perm=list(attr(n, "perm")))


@register("unsqueeze")
def _unsqueeze(ex: Exporter, n: Node) -> Any:
    return ex.op("Unsqueeze", [ex.val(n.inputs[0]), ex.ints([int(attr(n, "dim"))])])


@register("squeeze")
def _squeeze(ex: Exporter, n: Node) -> Any:
    dims = list(attr(n, "dims") or ())
    if not dims:
        return ex.op("Identity", [ex.val(n.inputs[0])])
    return ex.op("Squeeze", [ex.val(n.inputs[0]), ex.ints(dims)])


@register("expand")
def _expand(ex: Exporter, n: Node) -> Any:
    shape = [1 if isinstance(d, int) and d == -1 else d for d in attr(n, "shape")]
    return ex.op("Expand", [ex.val(n.inputs[0]), ex.dims(shape)])


@register("repeat")
def _repeat(ex: Exporter, n: Node) -> Any:
    reps = list(attr(n, "repeats"))
    x = ex.val(n.inputs[0])
    extra = len(reps) - tensor_of(n.inputs[0]).rank
    if extra > 0:
        x = ex.op("Unsqueeze", [x, ex.ints(list(range(extra)))])
    return ex.op("Tile", [x, ex.dims(reps)])


@register("flip")
def _flip(ex: Exporter, n: Node) -> Any:
    dims = list(attr(n, "dims"))
    k = len(dims)
    return ex.op(
        "Slice",
        [ex.val(n.inputs[0]), ex.ints([-1] * k), ex.ints([INT64_MIN] * k), ex.ints(dims), ex.ints([-1] * k)],
    )


@register("slice")
def _slice(ex: Exporter, n: Node) -> Any:
    start, end, step = attr(n, "start"), attr(n, "end"), int(attr(n, "step") or 1)
    dim = int(attr(n, "dim"))
    s = ex.expr(0 if start is None else start)
    e = ex.expr(INT64_MAX if end is None else end)
    return ex.op("Slice", [ex.val(n.inputs[0]), s, e, ex.ints([dim]), ex.ints([step])])


@register("select")
def _select(ex: Exporter, n: Node) -> Any:
    index = attr(n, "index")
    idx = ex.const(int(index), DType.i64) if isinstance(index, int) else ex.scalar_expr(index)
    return ex.op("Gather", [ex.val(n.inputs[0]), idx], axis=int(attr(n, "dim")))


@register("cat")
def _cat(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    return ex.op("Concat", [ex.val(v, dt) for v in n.inputs], axis=int(attr(n, "dim")))


@register("split")
def _split(ex: Exporter, n: Node) -> Any:
    sizes = list(attr(n, "sizes"))
    outs = ex.op("Split", [ex.val(n.inputs[0]), ex.dims(sizes)], n_out=len(sizes), axis=int(attr(n, "dim")))
    return [outs] if len(sizes) == 1 else outs


@register("embedding")
def _embedding(ex: Exporter, n: Node) -> Any:
    return ex.op("Gather", [ex.val(n.inputs[1]), ex.val(n.inputs[0])], axis=0)


@register("tril", "triu")
def _tri(ex: Exporter, n: Node) -> Any:
    k = attr(n, "diagonal")
    kk = ex.const(int(k), DType.i64) if isinstance(k, int) else ex.scalar_expr(k)
    return ex.op("Trilu", [ex.val(n.inputs[0]), kk], upper=int(n.op == "triu"))


@register("pad")
def _pad(ex: Exporter, n: Node) -> Any:
    pad = list(attr(n, "pad"))
    rank = tensor_of(n.inputs[0]).rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[
        str(attr(n, "mode"))
    ]
    dt = out_type(n).dtype
    args = [ex.val(n.inputs[0]), ex.dims(begins + ends)]
    if mode == "constant":
        value = attr(n, "value")
        args.append(ex.const(0 if value is None else value, dt))
    if mode == "wrap" and ex.opset < 19:
        raise ExportError("circular padding needs opset 19")
    return ex.op("Pad", args, mode=mode)


@register("full")
def _full(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    value = attr(n, "value")
    shape = ex.dims(attr(n, "shape"))
    if isinstance(value, sympy.Basic) and value.free_symbols:
        return ex.op("Expand", [ex.scalar_expr(value, dt), shape])
    tensor = ex.onnx.helper.make_tensor("value", onnx_dtype(dt), [1], [python_value(value, dt)])
    return ex.op("ConstantOfShape", [shape], value=tensor)


@register("arange")
def _arange(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    parts = []
    for k in ("start", "end", "step"):
        v = attr(n, k)
        if isinstance(v, sympy.Basic) and v.free_symbols:
            parts.append(ex.scalar_expr(v, dt))
        else:
            parts.append(ex.const(python_value(v, dt), dt))
    return ex.op("Range", parts)
