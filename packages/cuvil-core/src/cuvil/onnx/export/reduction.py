"""Reductions (``sum`` ... ``logsumexp``, ``all``/``any``), ``max``/``min`` along a dim
with their indices, ``argmax``/``argmin``, ``cumsum``, ``softmax`` and ``log_softmax``."""

from __future__ import annotations

from typing import Any

from cuvil.onnx.export.exporter import Exporter, attr, out_type, register, tensor_of
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType

#: Cuvil reduction -> the ONNX reduction (axes as an input, ``keepdims``); one to one
#: (see [Note: one-to-one ONNX tables] in :mod:`.elementwise`)
REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "prod": "ReduceProd",
    "amax": "ReduceMax",
    "amin": "ReduceMin",
    "logsumexp": "ReduceLogSumExp",
}


@register(*REDUCE, "all", "any")
def _reduce(ex: Exporter, n: Node) -> Any:
    dims = tuple(attr(n, "dims") or ())
    keep = int(bool(attr(n, "keepdim")))
    out = out_type(n).dtype
    x = n.inputs[0]
    if not dims:
        return ex.op("Identity", [ex.val(x, out)])
    if n.op in ("all", "any"):
        xi = ex.cast(ex.val(x, DType.bool), DType.bool, DType.i32)
        r = ex.op("ReduceMin" if n.op == "all" else "ReduceMax", [xi, ex.ints(dims)], keepdims=keep)
        return ex.cast(r, DType.i32, out)
    return ex.op(REDUCE[n.op], [ex.val(x, out), ex.ints(dims)], keepdims=keep)


@register("max", "min")
def _max_dim(ex: Exporter, n: Node) -> Any:
    x = ex.val(n.inputs[0])
    dim, keep = int(attr(n, "dim")), int(bool(attr(n, "keepdim")))
    red = ex.op("ReduceMax" if n.op == "max" else "ReduceMin", [x, ex.ints([dim])], keepdims=keep)
    idx = ex.op("ArgMax" if n.op == "max" else "ArgMin", [x], axis=dim, keepdims=keep)
    return [red, idx]


@register("argmax", "argmin")
def _argmax(ex: Exporter, n: Node) -> Any:
    x = ex.val(n.inputs[0])
    dim, keep = attr(n, "dim"), int(bool(attr(n, "keepdim")))
    op_type = "ArgMax" if n.op == "argmax" else "ArgMin"
    if dim is None:
        flat = ex.op("Reshape", [x, ex.ints([-1])])
        r = ex.op(op_type, [flat], axis=0, keepdims=0)
        if keep:
            r = ex.op("Reshape", [r, ex.ints([1] * tensor_of(n.inputs[0]).rank)])
        return r
    return ex.op(op_type, [x], axis=int(dim), keepdims=keep)


@register("cumsum")
def _cumsum(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    return ex.op("CumSum", [ex.val(n.inputs[0], dt), ex.const(int(attr(n, "dim")), DType.i64)])


@register("softmax", "log_softmax")
def _softmax(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    return ex.op(
        "Softmax" if n.op == "softmax" else "LogSoftmax",
        [ex.val(n.inputs[0], dt)],
        axis=int(attr(n, "dim")),
    )


__all__ = ["REDUCE"]
