"""Reductions (``Reduce*``), ``ArgMax``/``ArgMin``, ``Softmax``/``LogSoftmax`` and ``CumSum``."""

from __future__ import annotations

from typing import Any

from cuvil.onnx.export.reduction import REDUCE
from cuvil.onnx.import_.loader import Importer, OnnxImportError, inverse, norm_axis, rank, register

#: the export table read backwards, and two ONNX reductions written with ``mul``/``sqrt``
_REDUCE = {**inverse(REDUCE), "ReduceSumSquare": "sum", "ReduceL2": "sum"}


@register(*_REDUCE)
def _reduce(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = rank(x)
    axes = attrs.get("axes")
    if axes is None and len(ins) > 1 and ins[1]:
        axes = im.known(ins[1], f"{node.op_type} axes").ints()
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(r))
    keep = bool(attrs.get("keepdims", 1))
    dims = tuple(sorted(norm_axis(a, r) for a in axes))
    op = _REDUCE[node.op_type]
    if node.op_type in ("ReduceSumSquare", "ReduceL2"):
        x = im.emit("mul", [x, x])
    kw: dict[str, Any] = {"dims": dims, "keepdim": keep}
    if op in ("sum", "mean", "prod"):
        kw["dtype"] = None
    out = im.emit(op, [x], **kw)
    if node.op_type == "ReduceL2":
        out = im.emit("sqrt", [out])
    return out


@register("ArgMax", "ArgMin")
def _arg(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if attrs.get("select_last_index", 0):
        raise OnnxImportError("select_last_index=1")
    x = im.tensor(ins[0])
    return im.emit(
        node.op_type.lower(),
        [x],
        dim=norm_axis(attrs.get("axis", 0), rank(x)),
        keepdim=bool(attrs.get("keepdims", 1)),
    )


@register("Softmax", "LogSoftmax")
def _softmax(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = attrs.get("axis", -1 if im.opset >= 13 else 1)
    if im.opset < 13 and norm_axis(axis, rank(x)) != rank(x) - 1:
        raise OnnxImportError("Softmax before opset 13 over a non-last axis")
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    return im.emit(op, [x], dim=norm_axis(axis, rank(x)), dtype=None)


@register("CumSum")
def _cumsum(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if attrs.get("exclusive", 0) or attrs.get("reverse", 0):
        raise OnnxImportError("CumSum with exclusive or reverse")
    x = im.tensor(ins[0])
    axis = int(im.known(ins[1], "CumSum axis").array.reshape(-1)[0])
    return im.emit("cumsum", [x], dim=norm_axis(axis, rank(x)), dtype=None)


__all__: list[str] = []
