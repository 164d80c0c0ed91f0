"""Linear algebra and nn ops: matmul, linear, convolutions, pooling, layer norm and
interpolation (``Resize``)."""

from __future__ import annotations

from typing import Any

from cuvil.onnx.export.builder import ExportError, onnx_dtype
from cuvil.onnx.export.exporter import Exporter, attr, out_type, register, tensor_of
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType


@register("matmul")
def _matmul(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    return ex.op("MatMul", [ex.val(n.inputs[0], dt), ex.val(n.inputs[1], dt)])


@register("linear")
def _linear(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    x, w = ex.val(n.inputs[0], dt), ex.val(n.inputs[1], dt)
    wt = ex.op("Transpose", [w], perm=[1, 0]) if tensor_of(n.inputs[1]).rank == 2 else w
    y = ex.op("MatMul", [x, wt])
    if attr(n, "has_bias"):
        y = ex.op("Add", [y, ex.val(n.inputs[2], dt)])
    return y


def _ints(v: Any, k: int) -> list[int]:
    if isinstance(v, int):
        return [v] * k
    return [int(x) for x in v]


@register("conv", "conv_transpose")
def _conv(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    wt = tensor_of(n.inputs[1])
    k = wt.rank - 2
    ksize = list(wt.shape[2:])
    static = all(isinstance(d, int) for d in ksize)
    stride = _ints(attr(n, "stride"), k)
    dilation = _ints(attr(n, "dilation"), k)
    padding: Any = attr(n, "padding")
    if padding == "valid":
        padding = [0] * k
    elif padding == "same":
        if not static:
            raise ExportError("conv with padding='same' and a symbolic kernel size")
        total = [dl * (ks - 1) for dl, ks in zip(dilation, ksize)]
        pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    if padding != "same":
        pads = _ints(padding, k) * 2
    args = [ex.val(v, dt) for v in n.inputs]
    attrs: dict[str, Any] = {
        "strides": stride,
        "dilations": dilation,
        "pads": pads,
        "group": int(attr(n, "groups")),
        "kernel_shape": ksize if static else None,
    }
    if n.op == "conv_transpose":
        attrs["output_padding"] = _ints(attr(n, "output_padding"), k)
        return ex.op("ConvTranspose", args, **attrs)
    return ex.op("Conv", args, **attrs)


@register("max_pool", "avg_pool")
def _pool(ex: Exporter, n: Node) -> Any:
    ks = [int(x) for x in attr(n, "kernel_size")]
    k = len(ks)
    stride = _ints(attr(n, "stride") or ks, k)
    attrs: dict[str, Any] = {
        "kernel_shape": ks,
        "strides": stride,
        "pads": _ints(attr(n, "padding"), k) * 2,
        "ceil_mode": int(bool(attr(n, "ceil_mode"))),
    }
    x = ex.val(n.inputs[0])
    if n.op == "max_pool":
        attrs["dilations"] = _ints(attr(n, "dilation"), k)
        return ex.op("MaxPool", [x], **attrs)
    if attr(n, "divisor_override") is not None:
        raise ExportError("avg_pool with divisor_override")
    attrs["count_include_pad"] = int(bool(attr(n, "count_include_pad")))
    return ex.op("AveragePool", [x], **attrs)


@register("adaptive_avg_pool", "adaptive_max_pool")
def _adaptive(ex: Exporter, n: Node) -> Any:
    out = list(attr(n, "output_size"))
    x = ex.val(n.inputs[0])
    t = tensor_of(n.inputs[0])
    avg = n.op == "adaptive_avg_pool"
    if all(o == 1 for o in out):
        return ex.op("GlobalAveragePool" if avg else "GlobalMaxPool", [x])
    spatial = t.shape[2:]
    if all(isinstance(s, int) and isinstance(o, int) and s % o == 0 for s, o in zip(spatial, out)):
        ks = [int(s) // int(o) for s, o in zip(spatial, out)]
        return ex.op("AveragePool" if avg else "MaxPool", [x], kernel_shape=ks, strides=ks)
    raise ExportError("adaptive pooling to a size that does not divide the (static) input size")


@register("layer_norm")
def _layer_norm(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    ns = list(attr(n, "normalized_shape"))
    args = [ex.val(v, dt) for v in n.inputs]
    x, rest = args[0], args[1:]
    w = rest.pop(0) if attr(n, "has_weight") else None
    b = rest.pop(0) if attr(n, "has_bias") else None
    if w is None:
        w = ex.op(
            "ConstantOfShape",
            [ex.dims(ns)],
            value=ex.onnx.helper.make_tensor("value", onnx_dtype(dt), [1], [1.0]),
        )
    ins = [x, w] + ([b] if b is not None else [])
    return ex.op("LayerNormalization", ins, axis=-len(ns), epsilon=float(attr(n, "eps")))


@register("interpolate")
def _interpolate(ex: Exporter, n: Node) -> Any:
    if attr(n, "antialias"):
        raise ExportError("interpolate with antialias=True")
    mode = str(attr(n, "mode"))
    align = bool(attr(n, "align_corners"))
    x = ex.val(n.inputs[0])
    t = tensor_of(n.inputs[0])
    out = out_type(n)
    attrs: dict[str, Any] = {}
    if mode == "nearest":
        attrs.update(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    elif mode in ("linear", "bilinear", "trilinear", "bicubic"):
        attrs["mode"] = "cubic" if mode == "bicubic" else "linear"
        if mode == "bicubic":
            attrs["cubic_coeff_a"] = -0.75
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "pytorch_half_pixel"
    else:
        raise ExportError(f"interpolate mode {mode!r}")
    sf = attr(n, "scale_factor")
    if sf is not None and not attr(n, "recompute_scale_factor"):
        k = t.rank - 2
        scales = [1.0, 1.0] + ([float(sf)] * k if not isinstance(sf, tuple) else [float(s) for s in sf])
        return ex.op("Resize", [x, "", ex.const(scales, DType.f32, [len(scales)])], **attrs)
    return ex.op("Resize", [x, "", "", ex.dims(out.shape)], **attrs)
