"""Normalization, linear algebra and nn ops: ``LayerNormalization``, ``BatchNormalization``,
``MatMul``, ``Gemm``, convolutions, pooling and ``Resize``."""

from __future__ import annotations

from typing import Any

from cuvil.onnx.import_.loader import Importer, OnnxImportError, attribute_text, norm_axis, rank, register


@register("LayerNormalization")
def _layer_norm(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if len(node.output) > 1 and any(node.output[1:]):
        raise OnnxImportError("LayerNormalization with mean/inv_std_dev outputs")
    x = im.tensor(ins[0])
    r = rank(x)
    axis = norm_axis(attrs.get("axis", -1), r)
    ns = tuple(x.type.shape[axis:])  # type: ignore[union-attr]
    params = [im.tensor(ins[1])]
    has_bias = len(ins) > 2 and bool(ins[2])
    if has_bias:
        params.append(im.tensor(ins[2]))
    return im.emit(
        "layer_norm",
        [x, *params],
        normalized_shape=ns,
        eps=float(attrs.get("epsilon", 1e-5)),
        has_weight=True,
        has_bias=has_bias,
    )


@register("BatchNormalization")
def _batch_norm(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if attrs.get("training_mode", 0):
        raise OnnxImportError("BatchNormalization in training mode")
    x, w, b, mean, var = (im.tensor(i) for i in ins[:5])
    return im.emit(
        "batch_norm",
        [x, mean, var, w, b],
        eps=float(attrs.get("epsilon", 1e-5)),
        has_weight=True,
        has_bias=True,
    )


@register("MatMul")
def _matmul(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("matmul", [im.tensor(ins[0]), im.tensor(ins[1])])


@register("Gemm")
def _gemm(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    a, b = im.tensor(ins[0]), im.tensor(ins[1])
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    has_c = len(ins) > 2 and bool(ins[2])
    if ta:
        a = im.emit("permute", [a], perm=(1, 0))
    if tb and alpha == 1.0 and beta == 1.0:
        return im.emit("linear", [a, b] + ([im.tensor(ins[2])] if has_c else []), has_bias=has_c)
    if tb:
        b = im.emit("permute", [b], perm=(1, 0))
    y = im.emit("matmul", [a, b])
    if alpha != 1.0:
        y = im.emit("mul", [y, im.emit("const", [], value=alpha)])
    if has_c:
        c = im.tensor(ins[2])
        if beta != 1.0:
            c = im.emit("mul", [c, im.emit("const", [], value=beta)])
        y = im.emit("add", [y, c])
    return y


def _pads(attrs: dict[str, Any], k: int) -> tuple[int, ...]:
    auto = attribute_text(attrs.get("auto_pad", "NOTSET"))
    if auto not in ("NOTSET", "VALID"):
        raise OnnxImportError(f"auto_pad={auto}")
    pads = list(attrs.get("pads") or [0] * (2 * k))
    if pads[:k] != pads[k:]:
        raise OnnxImportError(f"asymmetric pads {pads}")
    return tuple(pads[:k])


@register("Conv", "ConvTranspose")
def _conv(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x, w = im.tensor(ins[0]), im.tensor(ins[1])
    k = rank(w) - 2
    has_bias = len(ins) > 2 and bool(ins[2])
    args = [x, w] + ([im.tensor(ins[2])] if has_bias else [])
    kw: dict[str, Any] = {
        "stride": tuple(attrs.get("strides") or [1] * k),
        "padding": _pads(attrs, k),
        "dilation": tuple(attrs.get("dilations") or [1] * k),
        "groups": int(attrs.get("group", 1)),
        "has_bias": has_bias,
    }
    if node.op_type == "ConvTranspose":
        if attrs.get("output_shape"):
            raise OnnxImportError("ConvTranspose with output_shape")
        kw["output_padding"] = tuple(attrs.get("output_padding") or [0] * k)
        return im.emit("conv_transpose", args, **kw)
    return im.emit("conv", args, **kw)


@register("MaxPool", "AveragePool")
def _pool(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        raise OnnxImportError("MaxPool with an indices output")
    x = im.tensor(ins[0])
    ks = tuple(attrs["kernel_shape"])
    k = len(ks)
    kw: dict[str, Any] = {
        "kernel_size": ks,
        "stride": tuple(attrs.get("strides") or [1] * k),
        "padding": _pads(attrs, k),
        "ceil_mode": bool(attrs.get("ceil_mode", 0)),
    }
    if node.op_type == "MaxPool":
        kw["dilation"] = tuple(attrs.get("dilations") or [1] * k)
        return im.emit("max_pool", [x], **kw)
    kw["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
    kw["divisor_override"] = None
    return im.emit("avg_pool", [x], **kw)


@register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    dims = tuple(range(2, rank(x)))
    if node.op_type == "GlobalAveragePool":
        return im.emit("mean", [x], dims=dims, keepdim=True, dtype=None)
    return im.emit("amax", [x], dims=dims, keepdim=True)


@register("Resize")
def _resize(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = rank(x)
    mode = attribute_text(attrs.get("mode", "nearest"))
    ctm = attribute_text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    scales = im.known(ins[2], "Resize scales").array.reshape(-1).tolist() if len(ins) > 2 and ins[2] else []
    sizes = im.known(ins[3], "Resize sizes").ints() if len(ins) > 3 and ins[3] else []
    if mode == "nearest":
        if ctm != "asymmetric" or attribute_text(attrs.get("nearest_mode", "round_prefer_floor")) != "floor":
            raise OnnxImportError(f"Resize nearest with {ctm}/{attrs.get('nearest_mode')}")
        tmode, align = "nearest", None
    elif mode in ("linear", "cubic"):
        if ctm not in ("pytorch_half_pixel", "align_corners", "half_pixel"):
            raise OnnxImportError(f"Resize {mode} with coordinate_transformation_mode={ctm}")
        tmode = {"linear": {3: "linear", 4: "bilinear", 5: "trilinear"}.get(r, "linear"), "cubic": "bicubic"}[
            mode
        ]
        align = ctm == "align_corners"
    else:
        raise OnnxImportError(f"Resize mode {mode}")
    if sizes:
        return im.emit(
            "interpolate",
            [x],
            size=tuple(sizes[2:]),
            scale_factor=None,
            mode=tmode,
            align_corners=align,
            recompute_scale_factor=None,
            antialias=False,
        )
    sf = tuple(float(s) for s in scales[2:])
    return im.emit(
        "interpolate",
        [x],
        size=None,
        scale_factor=sf,
        mode=tmode,
        align_corners=align,
        recompute_scale_factor=None,
        antialias=False,
    )


__all__: list[str] = []
