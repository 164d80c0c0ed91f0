"""Elementwise ops: unary math and activations, binary arithmetic, comparisons, logical
and bitwise ops, ``where``, ``clamp``, ``cast`` and ``const``.

[Note: one-to-one ONNX tables] :data:`UNARY` and :data:`BINARY` (and ``REDUCE`` in
:mod:`.reduction`) map a Cuvil op to the one ONNX op computing it. They are the only
statement of those pairs: the importer reads them backwards
(:mod:`cuvil.onnx.import_.ops_elementwise`), so an op added here is imported too, and
``test_onnx_tables.py`` round-trips every entry against eager PyTorch.
"""

from __future__ import annotations

import math
from typing import Any

import sympy

from cuvil.onnx.export.builder import ExportError, dtype_of
from cuvil.onnx.export.exporter import OPS, Exporter, OpFn, attr, out_type, register
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, ScalarType, promote_types

#: Cuvil op -> the ONNX op computing it from its input cast to the output dtype
UNARY = {
    "abs": "Abs",
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "erf": "Erf",
    "floor": "Floor",
    "ceil": "Ceil",
    "reciprocal": "Reciprocal",
    "sign": "Sign",
    "atan": "Atan",
    "asinh": "Asinh",
    "hardswish": "HardSwish",
    "mish": "Mish",
    "logical_not": "Not",
}


def _unary(onnx_op: str) -> OpFn:
    def fn(ex: Exporter, n: Node) -> Any:
        return ex.op(onnx_op, [ex.val(n.inputs[0], out_type(n).dtype)])

    return fn


for _k, _v in UNARY.items():
    OPS[_k] = _unary(_v)


def _fconst(ex: Exporter, value: float, dt: DType) -> str:
    return ex.const(value, dt)


# rsqrt, log1p, expm1, log2, square and trunc have no ONNX op: the exporter writes their
# fallback decompositions (cuvil_ir.graph_ir.fallbacks), not math of its own here
@register("hardsigmoid")
def _hardsigmoid(ex: Exporter, n: Node) -> Any:
    """ONNX's native HardSigmoid (its default alpha is 0.2, torch's slope 1/6)."""
    return ex.op("HardSigmoid", [ex.val(n.inputs[0], out_type(n).dtype)], alpha=1.0 / 6.0, beta=0.5)


@register("gelu")
def _gelu(ex: Exporter, n: Node) -> Any:
    if ex.opset < 20:
        return None  # no Gelu before opset 20: the decomposition
    return ex.op("Gelu", [ex.val(n.inputs[0], out_type(n).dtype)], approximate=str(attr(n, "approximate")))


@register("leaky_relu")
def _leaky(ex: Exporter, n: Node) -> Any:
    x = ex.val(n.inputs[0], out_type(n).dtype)
    return ex.op("LeakyRelu", [x], alpha=float(attr(n, "negative_slope")))


@register("elu")
def _elu(ex: Exporter, n: Node) -> Any:
    return ex.op("Elu", [ex.val(n.inputs[0], out_type(n).dtype)], alpha=float(attr(n, "alpha")))


@register("round")
def _round(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    x = ex.val(n.inputs[0], dt)
    d = int(attr(n, "decimals") or 0)
    if d == 0:
        return ex.op("Round", [x])
    s = _fconst(ex, 10.0**d, dt)
    return ex.op("Div", [ex.op("Round", [ex.op("Mul", [x, s])]), s])


_ARITH = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
}
_CMP = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}
_LOGICAL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
_BITWISE = {
    "bitwise_and": ("BitwiseAnd", "And"),
    "bitwise_or": ("BitwiseOr", "Or"),
    "bitwise_xor": ("BitwiseXor", "Xor"),
}
#: Cuvil op -> the ONNX op computing it from its two inputs (cast as ``_binary`` says;
#: a bitwise op of bools is the logical op)
BINARY = {**_ARITH, **_CMP, **_LOGICAL, **{k: bit for k, (bit, _) in _BITWISE.items()}}


@register(*_ARITH, *_CMP, "ne", *_LOGICAL, *_BITWISE, "floor_divide", "remainder", "fmod", "atan2")
def _binary(ex: Exporter, n: Node) -> Any:
    a, b = n.inputs
    out = out_type(n).dtype
    if n.op in _ARITH:
        if n.op == "pow" and isinstance(b.type, ScalarType) and out.is_floating:
            return ex.op("Pow", [ex.val(a, out), ex.val(b, DType.f32 if out != DType.f64 else DType.f64)])
        return ex.op(_ARITH[n.op], [ex.val(a, out), ex.val(b, out)])
    if n.op in _CMP or n.op == "ne":
        ct = promote_types(a.type, b.type)
        if n.op == "ne":
            return ex.op("Not", [ex.op("Equal", [ex.val(a, ct), ex.val(b, ct)])])
        return ex.op(_CMP[n.op], [ex.val(a, ct), ex.val(b, ct)])
    if n.op in _LOGICAL:
        return ex.op(_LOGICAL[n.op], [ex.val(a, DType.bool), ex.val(b, DType.bool)])
    if n.op in _BITWISE:
        bit, logical = _BITWISE[n.op]
        return ex.op(logical if out == DType.bool else bit, [ex.val(a, out), ex.val(b, out)])
    x, y = ex.val(a, out), ex.val(b, out)
    if n.op == "fmod":
        return ex.op("Mod", [x, y], fmod=1)
    if n.op == "atan2":
        raise ExportError("atan2 has no ONNX translation")
    if out.is_floating:
        q = ex.op("Floor", [ex.op("Div", [x, y])])
        if n.op == "floor_divide":
            return q
        return ex.op("Sub", [x, ex.op("Mul", [q, y])])
    if n.op == "remainder":
        return ex.op("Mod", [x, y], fmod=0)
    # integer floor division: (x - mod(x, y)) / y is exact
    return ex.op("Div", [ex.op("Sub", [x, ex.op("Mod", [x, y], fmod=0)]), y])


@register("bitwise_not")
def _bnot(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    return ex.op("Not" if dt == DType.bool else "BitwiseNot", [ex.val(n.inputs[0], dt)])


@register("where")
def _where(ex: Exporter, n: Node) -> Any:
    c, a, b = n.inputs
    dt = out_type(n).dtype
    return ex.op("Where", [ex.val(c, DType.bool), ex.val(a, dt), ex.val(b, dt)])


@register("clamp")
def _clamp(ex: Exporter, n: Node) -> Any:
    dt = out_type(n).dtype
    lo, hi = attr(n, "min"), attr(n, "max")
    args = [ex.val(n.inputs[0], dt)]
    args.append("" if lo is None else ex.const(lo, dt))
    args.append("" if hi is None else ex.const(hi, dt))
    while args[-1] == "":
        args.pop()
    return ex.op("Clip", args)


@register("cast")
def _cast(ex: Exporter, n: Node) -> Any:
    return ex.op("Identity", [ex.val(n.inputs[0], out_type(n).dtype)])


@register("const")
def _const(ex: Exporter, n: Node) -> Any:
    value = attr(n, "value")
    t = n.outputs[0].type
    dt = dtype_of(t)
    if isinstance(value, sympy.Basic) and value.free_symbols:
        return ex.scalar_expr(value, dt)
    if isinstance(value, sympy.Basic):
        value = bool(value) if dt == DType.bool else (int(value) if dt.is_integer else float(value))
    name = ex.const(value, dt)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        ex.numbers[name] = float(value)
    return name


__all__ = ["BINARY", "UNARY"]
