"""Elementwise ops: arithmetic, comparisons, logical and bitwise ops, unary math and
activations, ``Where``, ``Clip``, casts, ``Identity``/``Dropout``. Known operands fold
(:mod:`.folding`). The one-to-one ops are the export tables read backwards
(:func:`~cuvil.onnx.import_.loader.inverse`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.onnx.export.elementwise import BINARY, UNARY
from cuvil.onnx.import_.folding import Known, fold_binary, fold_unary, fold_variadic
from cuvil.onnx.import_.loader import (
    Importer,
    OnnxImportError,
    attribute_text,
    dtype_of,
    inverse,
    register,
    to_dtype,
)

#: ONNX op -> Cuvil op: the export table read backwards, less ``Div`` (an integer ``Div``
#: truncates: ``div`` then ``trunc``) and ``Max``/``Min`` (any number of inputs), which
#: have handlers of their own below
_ELEMENTWISE = inverse(BINARY, unless=("Div", "Max", "Min"))


@register(*_ELEMENTWISE, "Div")
def _binary(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ka, kb = im.maybe_known(ins[0]), im.maybe_known(ins[1])
    if ka is not None and kb is not None:
        folded = fold_binary(node.op_type, ka, kb)
        if folded is not None:
            return folded
    a, b = im.tensor(ins[0]), im.tensor(ins[1])
    if node.op_type == "Div":
        dt = dtype_of(a)
        out = im.emit("div", [a, b])
        if dt.is_integer:
            out = im.emit("cast", [im.emit("trunc", [out])], dtype=dt)
        return out
    return im.emit(_ELEMENTWISE[node.op_type], [a, b])


@register("Max", "Min", "Sum", "Mean")
def _variadic(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ks = [im.maybe_known(i) for i in ins]
    folded = fold_variadic(node.op_type, ks)
    if folded is not None:
        return folded
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[node.op_type]
    vals = [im.tensor(i) for i in ins]
    out = vals[0]
    for v in vals[1:]:
        out = im.emit(op, [out, v])
    if node.op_type == "Mean" and len(vals) > 1:
        out = im.emit("div", [out, im.emit("const", [], value=len(vals))])
    return out


@register("Mod")
def _mod(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    a, b = im.tensor(ins[0]), im.tensor(ins[1])
    return im.emit("fmod" if attrs.get("fmod", 0) else "remainder", [a, b])


#: the export table read backwards, and ``BitwiseNot`` (exported only for non-bool operands)
_UNARY = {**inverse(UNARY), "BitwiseNot": "bitwise_not"}


@register(*_UNARY)
def _unary(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    k = im.maybe_known(ins[0])
    if k is not None:
        folded = fold_unary(node.op_type, k)
        if folded is not None:
            return folded
    return im.emit(_UNARY[node.op_type], [im.tensor(ins[0])])


@register("Round")
def _round(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("round", [im.tensor(ins[0])], decimals=0)


@register("Softplus")
def _softplus(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("softplus", [im.tensor(ins[0])], beta=1.0, threshold=20.0)


@register("LeakyRelu")
def _leaky(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("leaky_relu", [im.tensor(ins[0])], negative_slope=float(attrs.get("alpha", 0.01)))


@register("Elu")
def _elu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("elu", [im.tensor(ins[0])], alpha=float(attrs.get("alpha", 1.0)))


@register("HardSigmoid")
def _hardsigmoid(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    x = im.tensor(ins[0])
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return im.emit("hardsigmoid", [x])
    y = im.emit(
        "add", [im.emit("mul", [x, im.emit("const", [], value=alpha)]), im.emit("const", [], value=beta)]
    )
    return im.emit("clamp", [y], min=0.0, max=1.0)


@register("Gelu")
def _gelu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("gelu", [im.tensor(ins[0])], approximate=attribute_text(attrs.get("approximate", "none")))


@register("Where")
def _where(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    kc, ka, kb = (im.maybe_known(i) for i in ins)
    if kc is not None and ka is not None and kb is not None:
        return Known(np.where(kc.array.astype(bool), ka.array, kb.array), ka.dtype)
    return im.emit("where", [im.tensor(i) for i in ins])


@register("Clip")
def _clip(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    lo = attrs.get("min")
    hi = attrs.get("max")
    if len(ins) > 1 and ins[1]:
        lo = im.known(ins[1], "Clip min").array.reshape(-1)[0]
    if len(ins) > 2 and ins[2]:
        hi = im.known(ins[2], "Clip max").array.reshape(-1)[0]
    x = im.tensor(ins[0])
    dt = dtype_of(x)

    def conv(v: Any) -> Any:
        return None if v is None else (float(v) if dt.is_floating else int(v))

    return im.emit("clamp", [x], min=conv(lo), max=conv(hi))


@register("Cast", "CastLike")
def _cast(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if node.op_type == "Cast":
        dt = to_dtype(attrs["to"])
    else:
        other = im.env[ins[1]]
        dt = other.dtype if isinstance(other, Known) else dtype_of(other)
    k = im.maybe_known(ins[0])
    if k is not None:
        return Known(k.array, dt)
    x = im.tensor(ins[0])
    if dtype_of(x) == dt:
        return x
    return im.emit("cast", [x], dtype=dt)


@register("Identity", "Dropout")
def _identity(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.env[ins[0]]
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        raise OnnxImportError("Dropout with a mask output")
    return v


__all__: list[str] = []
