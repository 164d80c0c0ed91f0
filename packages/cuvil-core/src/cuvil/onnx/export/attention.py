"""Scaled dot-product attention (``sdpa``): ``Softmax(Q Kᵀ · scale + mask) V``, with the
causal mask as a ``Trilu`` of ones."""

from __future__ import annotations

import math
from typing import Any

from cuvil.onnx.export.builder import ExportError, dtype_of
from cuvil.onnx.export.exporter import Exporter, attr, out_type, register, tensor_of
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType


@register("sdpa")
def _sdpa(ex: Exporter, n: Node) -> Any:
    if attr(n, "enable_gqa"):
        raise ExportError("sdpa with enable_gqa=True")
    dt = out_type(n).dtype
    q, k, v = (ex.val(x, dt) for x in n.inputs[:3])
    qt = tensor_of(n.inputs[0])
    rank = qt.rank
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scale = attr(n, "scale")
    e = qt.shape[-1]
    s = ex.op("MatMul", [q, ex.op("Transpose", [k], perm=perm)])
    if scale is not None:
        sc = ex.const(float(scale), dt)
    elif isinstance(e, int):
        sc = ex.const(1.0 / math.sqrt(e), dt)
    else:
        sc = ex.op("Reciprocal", [ex.op("Sqrt", [ex.scalar_expr(e, dt)])])
    s = ex.op("Mul", [s, sc])
    ninf = ex.const(float("-inf"), dt)
    if attr(n, "is_causal"):
        shp = ex.op("Shape", [s], start=-2)
        ones = ex.op(
            "ConstantOfShape",
            [shp],
            value=ex.onnx.helper.make_tensor("value", ex.onnx.TensorProto.BOOL, [1], [True]),
        )
        s = ex.op("Where", [ex.op("Trilu", [ones], upper=0), s, ninf])
    if attr(n, "has_mask"):
        mask = n.inputs[3]
        if dtype_of(mask.type) == DType.bool:
            s = ex.op("Where", [ex.val(mask), s, ninf])
        else:
            s = ex.op("Add", [s, ex.val(mask, dt)])
    return ex.op("MatMul", [ex.op("Softmax", [s], axis=-1), v])
