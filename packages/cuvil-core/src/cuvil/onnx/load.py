"""ONNX -> Graph IR, and :class:`OnnxFunction`: what ``cu.compile_onnx`` returns.

Each ONNX node is translated by the handler registered for its op type in
:data:`OPS` into registered Graph IR ops (output types come from each op's own
shape rule, under a :class:`ShapeContext` with the call's sizes as hints, so the
size facts the graph relies on become its assumptions, exactly as in tracing).
An op type without a handler is an :class:`OnnxImportError` naming the op type and
the node.

Shape computations (``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape``, as the
exporters write them) are folded at import time: a value whose contents are known
(constants, initializers used as shapes/axes, ``Shape`` of a tensor with symbolic
dims) is kept as a numpy array whose elements may be size expressions, and turns
into an attribute where an op needs one. Initializers used as tensors become
graph inputs that the callable passes on every call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sympy
import torch

from cuvil.onnx.export.exporter import python_value as _py
from cuvil_ir.graph_ir.nodes import Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types, registrar
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext, evaluate_bool, symbol


class OnnxImportError(NotImplementedError):
    """An ONNX node this importer cannot translate (names the op type and node)."""


_ONNX_TO_DTYPE: dict[int, DType] = {}


def to_dtype(elem_type: int) -> DType:
    if not _ONNX_TO_DTYPE:
        from cuvil.onnx.export.builder import onnx_dtype

        for dt in DType:
            _ONNX_TO_DTYPE[onnx_dtype(dt)] = dt
    try:
        return _ONNX_TO_DTYPE[elem_type]
    except KeyError:
        raise OnnxImportError(f"ONNX element type {elem_type} is not supported") from None


def _ident(name: str, fallback: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if not out or out[0].isdigit():
        out = f"{fallback}_{out}"
    return out


def _sym(name: str) -> sympy.Symbol:
    try:
        return symbol(name)
    except ValueError:
        return symbol(f"s_{name}")


class Known:
    """A value whose contents are known at import time (elements: ints, floats, sympy)."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: Any, dtype: DType) -> None:
        self.array = np.asarray(array, dtype=object) if not isinstance(array, np.ndarray) else array
        self.dtype = dtype

    def ints(self) -> list[Any]:
        return [_as_dim(v) for v in self.array.reshape(-1).tolist()]


def _as_dim(v: Any) -> Any:
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, sympy.Basic):
        v = sympy.sympify(v)
        return int(v) if v.is_Integer else v
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    return v


# -- the importer -----------------------------------------------------------------------
class Importer:
    def __init__(
        self, model: Any, hints: dict[sympy.Symbol, int], input_types: list[TensorType], device: str = "cpu"
    ) -> None:
        from onnx import numpy_helper

        self.model = model
        #: the torch device type the graph runs on (its inputs, constants and factories)
        self.device = device
        g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
        self.ctx = ShapeContext(hints=hints)
        self.env: dict[str, Value | Known] = {}
        self.nodes: list[Node] = []
        self.counter = 0
        self.inputs: list[Value] = []
        self.consts: list[torch.Tensor] = []
        self.inits: dict[str, Any] = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        self.init_types = {i.name: to_dtype(i.data_type) for i in g.initializer}
        self.materialized: dict[str, Value] = {}
        names = [i.name for i in g.input if i.name not in self.inits]
        for name, t in zip(names, input_types):
            v = Value(_ident(name, "in"), t)
            self.inputs.append(v)
            self.env[name] = v
        for name, arr in self.inits.items():
            self.env[name] = Known(arr, self.init_types[name])

    # values ---------------------------------------------------------------------------
    def fresh(self, t: Type) -> Value:
        self.counter += 1
        return Value(f"v{self.counter}", t)

    def emit(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Any:
        opdef = REGISTRY.get(op)
        types = infer_types(opdef, self.ctx, [v.type for v in inputs], attrs)
        outs = tuple(self.fresh(t) for t in types)
        self.nodes.append(Node(op, tuple(inputs), outs, tuple(attrs.items())))
        return outs[0] if opdef.num_outputs == 1 else outs

    def tensor(self, name: str) -> Value:
        """The IR value of ONNX value ``name`` (materializing known contents)."""
        v = self.env[name]
        if isinstance(v, Value):
            return v
        if name in self.materialized:
            return self.materialized[name]
        out = self.materialize(v, name)
        self.materialized[name] = out
        return out

    def materialize(self, k: Known, name: str = "const") -> Value:
        arr = k.array
        flat = [_as_dim(x) for x in np.asarray(arr, dtype=object).reshape(-1).tolist()]
        shape = tuple(int(s) for s in arr.shape)
        symbolic = any(isinstance(x, sympy.Basic) for x in flat)
        if len(flat) == 1:
            value = flat[0]
            if not symbolic:
                value = _py(value, k.dtype)
            return self.emit("full", [], shape=shape, value=value, dtype=k.dtype, device=self.device)  # type: ignore[no-any-return]
        if symbolic:
            parts = [
                self.emit("full", [], shape=(1,), value=x, dtype=k.dtype, device=self.device) for x in flat
            ]
            out = self.emit("cat", parts, dim=0)
            return self.emit("reshape", [out], shape=shape)  # type: ignore[no-any-return]
        t = torch.tensor(np.asarray(arr).astype(_np_dtype(k.dtype)), dtype=k.dtype.torch, device=self.device)
        v = Value(_ident(f"const_{name}", "c"), TensorType(k.dtype, shape, self.device))
        self.inputs.append(v)
        self.consts.append(t)
        return v

    def known(self, name: str, what: str) -> Known:
        v = self.env.get(name)
        if isinstance(v, Known):
            return v
        raise OnnxImportError(f"{what}: input {name!r} must be known when importing (a constant or shape)")

    def maybe_known(self, name: str) -> Known | None:
        v = self.env.get(name)
        return v if isinstance(v, Known) else None

    # graph ----------------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.model.graph
        self.run_nodes(g.node)
        outputs = tuple(self.tensor(o.name) for o in g.output)
        return Graph(
            _ident(g.name or "onnx", "g"),
            tuple(self.inputs),
            tuple(self.nodes),
            outputs,
            tuple(self.ctx.assumptions),
        )

    def block(self, g: Any, bind: dict[str, Value | Known]) -> tuple[tuple[Node, ...], list[Value]]:
        """A region from subgraph ``g``: its nodes and its outputs as values (outer names
        stay visible; ``bind`` gives the block's inputs)."""
        from onnx import numpy_helper

        saved = (self.env, self.materialized, self.nodes)
        self.env = {**self.env, **bind}
        self.materialized = dict(self.materialized)
        self.nodes = []
        try:
            for i in g.initializer:
                self.env[i.name] = Known(numpy_helper.to_array(i), to_dtype(i.data_type))
            self.run_nodes(g.node)
            results = [self.tensor(o.name) for o in g.output]
            return tuple(self.nodes), results
        finally:
            self.env, self.materialized, self.nodes = saved

    def inline(self, g: Any) -> list[Value | Known]:
        """Subgraph ``g``'s nodes added to the current block (its names scoped)."""
        from onnx import numpy_helper

        saved = (self.env, self.materialized)
        self.env = dict(self.env)
        self.materialized = dict(self.materialized)
        try:
            for i in g.initializer:
                self.env[i.name] = Known(numpy_helper.to_array(i), to_dtype(i.data_type))
            self.run_nodes(g.node)
            return [self.env[o.name] for o in g.output]
        finally:
            self.env, self.materialized = saved

    def run_nodes(self, nodes: Any) -> None:
        for node in nodes:
            handler = OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if handler is None:
                raise OnnxImportError(
                    f"ONNX op {node.op_type!r} (node {node.name!r}) has no Graph IR translation"
                    + (f" (domain {node.domain!r})" if node.domain not in ("", "ai.onnx") else "")
                )
            ins = list(node.input)
            attrs = {a.name: _attr(a) for a in node.attribute}
            try:
                outs = handler(self, node, ins, attrs)
            except OnnxImportError as e:
                if node.name and node.name not in str(e):
                    raise OnnxImportError(f"{node.op_type} node {node.name!r}: {e}") from e
                raise
            except Exception as e:
                raise OnnxImportError(f"{node.op_type} node {node.name!r}: {type(e).__name__}: {e}") from e
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            for oname, v in zip(node.output, outs):
                if oname:
                    self.env[oname] = v


def _np_dtype(dt: DType) -> Any:
    return torch.empty((), dtype=dt.torch).numpy().dtype if dt != DType.bf16 else np.float32


def _attr(a: Any) -> Any:
    from onnx import helper

    return helper.get_attribute_value(a)


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


# -- the op table ------------------------------------------------------------------------
Handler = Callable[[Importer, Any, list[str], dict[str, Any]], Any]
OPS: dict[str, Handler] = {}


_reg = registrar(OPS)


def _rank(v: Value) -> int:
    t = v.type
    return t.rank if isinstance(t, TensorType) else 0


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dtype(v: Value) -> DType:
    t = v.type
    assert isinstance(t, TensorType)
    return t.dtype


_NUMPY_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Equal": lambda a, b: np.vectorize(lambda x, y: bool(sympy.Eq(x, y)) if _decidable(x, y) else None)(a, b),
}


def _exact_div(x: Any, y: Any) -> Any:
    """``x / y`` of known values, exact (rational) when both are integral."""
    x, y = _as_dim(x), _as_dim(y)
    if isinstance(x, sympy.Basic) or isinstance(y, sympy.Basic):
        return sympy.sympify(x) / sympy.sympify(y)
    return x / y


def _decidable(x: Any, y: Any) -> bool:
    try:
        bool(sympy.Eq(x, y))
        return True
    except TypeError:
        return False


_ELEMENTWISE = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Pow": "pow",
    "Equal": "eq",
    "Less": "lt",
    "LessOrEqual": "le",
    "Greater": "gt",
    "GreaterOrEqual": "ge",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}


_RELATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "Less": sympy.Lt,
    "LessOrEqual": sympy.Le,
    "Greater": sympy.Gt,
    "GreaterOrEqual": sympy.Ge,
    "And": sympy.And,
    "Or": sympy.Or,
}


@_reg(*_ELEMENTWISE, "Div")
def _binary(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ka, kb = im.maybe_known(ins[0]), im.maybe_known(ins[1])
    if ka is not None and kb is not None and node.op_type in ("Add", "Sub", "Mul", "Div", "Equal"):
        if node.op_type == "Div":
            if ka.dtype.is_integer:
                res = np.vectorize(
                    lambda x, y: (
                        sympy.floor(sympy.sympify(x) / y) if isinstance(x, sympy.Basic) else int(x) // int(y)
                    ),
                    otypes=[object],
                )(ka.array, kb.array)
            else:
                res = np.vectorize(_exact_div, otypes=[object])(ka.array, kb.array)
        else:
            res = _NUMPY_BINARY[node.op_type](ka.array, kb.array)
        if not (node.op_type == "Equal" and any(x is None for x in np.asarray(res).reshape(-1))):
            return Known(np.asarray(res, dtype=object), DType.bool if node.op_type == "Equal" else ka.dtype)
    if (
        ka is not None
        and kb is not None
        and node.op_type in _RELATIONS
        and ka.array.size == kb.array.size == 1
    ):
        # a size predicate (one element; e.g. the condition of an If on sizes)
        x, y = _as_dim(ka.array.reshape(-1)[0]), _as_dim(kb.array.reshape(-1)[0])
        rel = _RELATIONS[node.op_type](sympy.sympify(x), sympy.sympify(y))
        val = bool(rel) if isinstance(rel, sympy.logic.boolalg.BooleanAtom) else rel
        shape = np.broadcast_shapes(ka.array.shape, kb.array.shape)
        return Known(np.full(shape, val, dtype=object), DType.bool)
    a, b = im.tensor(ins[0]), im.tensor(ins[1])
    if node.op_type == "Div":
        dt = _dtype(a)
        out = im.emit("div", [a, b])
        if dt.is_integer:
            out = im.emit("cast", [im.emit("trunc", [out])], dtype=dt)
        return out
    return im.emit(_ELEMENTWISE[node.op_type], [a, b])


@_reg("Max", "Min", "Sum", "Mean")
def _variadic(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ks = [im.maybe_known(i) for i in ins]
    if node.op_type in ("Max", "Min") and all(k is not None and k.array.size == 1 for k in ks):
        vals_k = [_as_dim(k.array.reshape(-1)[0]) for k in ks if k is not None]
        fn = sympy.Max if node.op_type == "Max" else sympy.Min
        return Known(np.array(_as_dim(fn(*vals_k)), dtype=object), ks[0].dtype)  # type: ignore[union-attr]
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[node.op_type]
    vals = [im.tensor(i) for i in ins]
    out = vals[0]
    for v in vals[1:]:
        out = im.emit(op, [out, v])
    if node.op_type == "Mean" and len(vals) > 1:
        out = im.emit("div", [out, im.emit("const", [], value=len(vals))])
    return out


@_reg("Mod")
def _mod(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    a, b = im.tensor(ins[0]), im.tensor(ins[1])
    return im.emit("fmod" if attrs.get("fmod", 0) else "remainder", [a, b])


_UNARY = {
    "Abs": "abs",
    "Neg": "neg",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Relu": "relu",
    "Erf": "erf",
    "Floor": "floor",
    "Ceil": "ceil",
    "Reciprocal": "reciprocal",
    "Sign": "sign",
    "Atan": "atan",
    "Not": "logical_not",
    "BitwiseNot": "bitwise_not",
    "HardSwish": "hardswish",
    "Mish": "mish",
}


@_reg(*_UNARY)
def _unary(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    k = im.maybe_known(ins[0])
    if k is not None and node.op_type == "Neg":
        return Known(-k.array, k.dtype)
    if k is not None and node.op_type == "Not" and k.array.size == 1:
        v = _known_scalar(k)
        if isinstance(v, (bool, sympy.logic.boolalg.Boolean)):
            return Known(
                np.full(k.array.shape, sympy.Not(v) if isinstance(v, sympy.Basic) else not v, dtype=object),
                k.dtype,
            )
    if k is not None and node.op_type in ("Ceil", "Floor") and k.array.size == 1:
        fn = sympy.ceiling if node.op_type == "Ceil" else sympy.floor
        return Known(np.array(_as_dim(fn(_as_dim(k.array.reshape(-1)[0]))), dtype=object), k.dtype)
    return im.emit(_UNARY[node.op_type], [im.tensor(ins[0])])


@_reg("Round")
def _round(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("round", [im.tensor(ins[0])], decimals=0)


@_reg("Softplus")
def _softplus(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("softplus", [im.tensor(ins[0])], beta=1.0, threshold=20.0)


@_reg("LeakyRelu")
def _leaky(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("leaky_relu", [im.tensor(ins[0])], negative_slope=float(attrs.get("alpha", 0.01)))


@_reg("Elu")
def _elu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("elu", [im.tensor(ins[0])], alpha=float(attrs.get("alpha", 1.0)))


@_reg("HardSigmoid")
def _hardsigmoid(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    x = im.tensor(ins[0])
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return im.emit("hardsigmoid", [x])
    y = im.emit(
        "add", [im.emit("mul", [x, im.emit("const", [], value=alpha)]), im.emit("const", [], value=beta)]
    )
    return im.emit("clamp", [y], min=0.0, max=1.0)


@_reg("Gelu")
def _gelu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("gelu", [im.tensor(ins[0])], approximate=_s(attrs.get("approximate", "none")))


@_reg("Where")
def _where(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    kc, ka, kb = (im.maybe_known(i) for i in ins)
    if kc is not None and ka is not None and kb is not None:
        return Known(np.where(kc.array.astype(bool), ka.array, kb.array), ka.dtype)
    return im.emit("where", [im.tensor(i) for i in ins])


@_reg("Clip")
def _clip(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    lo = attrs.get("min")
    hi = attrs.get("max")
    if len(ins) > 1 and ins[1]:
        lo = im.known(ins[1], "Clip min").array.reshape(-1)[0]
    if len(ins) > 2 and ins[2]:
        hi = im.known(ins[2], "Clip max").array.reshape(-1)[0]
    x = im.tensor(ins[0])
    dt = _dtype(x)

    def conv(v: Any) -> Any:
        return None if v is None else (float(v) if dt.is_floating else int(v))

    return im.emit("clamp", [x], min=conv(lo), max=conv(hi))


@_reg("Cast", "CastLike")
def _cast(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if node.op_type == "Cast":
        dt = to_dtype(attrs["to"])
    else:
        other = im.env[ins[1]]
        dt = other.dtype if isinstance(other, Known) else _dtype(other)
    k = im.maybe_known(ins[0])
    if k is not None:
        return Known(k.array, dt)
    x = im.tensor(ins[0])
    if _dtype(x) == dt:
        return x
    return im.emit("cast", [x], dtype=dt)


@_reg("Identity", "Dropout")
def _identity(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.env[ins[0]]
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        raise OnnxImportError("Dropout with a mask output")
    return v


@_reg("Constant")
def _constant(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return Known(numpy_helper.to_array(a.t), to_dtype(a.t.data_type))
        if a.name in ("value_int", "value_float"):
            return Known(
                np.array(a.i if a.name == "value_int" else a.f),
                DType.i64 if a.name == "value_int" else DType.f32,
            )
        if a.name in ("value_ints", "value_floats"):
            vals = list(a.ints) if a.name == "value_ints" else list(a.floats)
            return Known(np.array(vals), DType.i64 if a.name == "value_ints" else DType.f32)
    raise OnnxImportError("Constant without a supported value attribute")


@_reg("Shape")
def _shape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.env[ins[0]]
    shape = list(v.array.shape) if isinstance(v, Known) else list(v.type.shape)  # type: ignore[union-attr]
    r = len(shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = max(0, min(r, start + r if start < 0 else start))
    end = max(0, min(r, end + r if end < 0 else end))
    return Known(np.array(shape[start:end], dtype=object), DType.i64)


@_reg("Size")
def _size(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    v = im.tensor(ins[0])
    n: Any = 1
    for d in v.type.shape:  # type: ignore[union-attr]
        n = n * d
    return Known(np.array(n, dtype=object), DType.i64)


@_reg("Gather")
def _gather(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axis = attrs.get("axis", 0)
    kd, ki = im.maybe_known(ins[0]), im.maybe_known(ins[1])
    if kd is not None and ki is not None and kd.array.size <= 64:
        idx = ki.array.astype(np.int64)
        return Known(np.take(kd.array, idx, axis=axis), kd.dtype)
    if ki is not None and ki.array.ndim == 0:
        x = im.tensor(ins[0])
        return im.emit("select", [x], dim=_norm(axis, _rank(x)), index=_as_dim(ki.array.reshape(-1)[0]))
    x, i = im.tensor(ins[0]), im.tensor(ins[1])
    if _norm(axis, _rank(x)) == 0 and _rank(x) == 2:
        if _dtype(i) not in (DType.i32, DType.i64):
            i = im.emit("cast", [i], dtype=DType.i64)
        return im.emit("embedding", [i, x])
    raise OnnxImportError("Gather of tensor indices along an axis other than 0 of a 2-D tensor")


@_reg("Unsqueeze")
def _unsqueeze(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axes = attrs.get("axes")
    if axes is None:
        axes = im.known(ins[1], "Unsqueeze axes").ints()
    k = im.maybe_known(ins[0])
    if k is not None:
        r = k.array.ndim + len(axes)
        arr = k.array
        for a in sorted(_norm(a, r) for a in axes):
            arr = np.expand_dims(arr, a)
        return Known(arr, k.dtype)
    x = im.tensor(ins[0])
    r = _rank(x) + len(axes)
    for a in sorted(_norm(a, r) for a in axes):
        x = im.emit("unsqueeze", [x], dim=a)
    return x


@_reg("Squeeze")
def _squeeze(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axes = attrs.get("axes")
    if axes is None and len(ins) > 1 and ins[1]:
        axes = im.known(ins[1], "Squeeze axes").ints()
    k = im.maybe_known(ins[0])
    if k is not None:
        return Known(np.squeeze(k.array, axis=None if axes is None else tuple(axes)), k.dtype)
    x = im.tensor(ins[0])
    r = _rank(x)
    if axes is None:
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]  # type: ignore[union-attr]
    return im.emit("squeeze", [x], dims=tuple(sorted(_norm(a, r) for a in axes)))


@_reg("Concat")
def _concat(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    axis = attrs["axis"]
    ks = [im.maybe_known(i) for i in ins]
    if all(k is not None for k in ks):
        return Known(np.concatenate([k.array for k in ks if k is not None], axis=axis), ks[0].dtype)  # type: ignore[union-attr]
    vals = [im.tensor(i) for i in ins]
    return im.emit("cat", vals, dim=_norm(axis, _rank(vals[0])))


@_reg("Reshape")
def _reshape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    shape = im.known(ins[1], "Reshape shape").ints()
    k = im.maybe_known(ins[0])
    x_shape = list(k.array.shape) if k is not None else list(im.tensor(ins[0]).type.shape)  # type: ignore[union-attr]
    if not attrs.get("allowzero", 0):
        shape = [x_shape[i] if (isinstance(d, int) and d == 0) else d for i, d in enumerate(shape)]
    if k is not None and all(isinstance(d, int) for d in shape):
        return Known(k.array.reshape(shape), k.dtype)
    return im.emit("reshape", [im.tensor(ins[0])], shape=tuple(shape))


@_reg("Flatten")
def _flatten(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = _norm(attrs.get("axis", 1), _rank(x))
    shape = list(x.type.shape)  # type: ignore[union-attr]
    a: Any = 1
    for d in shape[:axis]:
        a = a * d
    return im.emit("reshape", [x], shape=(_as_dim(a), -1))


@_reg("Transpose")
def _transpose(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    perm = attrs.get("perm") or list(reversed(range(_rank(x))))
    return im.emit("permute", [x], perm=tuple(perm))


@_reg("Expand")
def _expand(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    shape = im.known(ins[1], "Expand shape").ints()
    x = im.tensor(ins[0])
    xs = list(x.type.shape)  # type: ignore[union-attr]
    r = max(len(xs), len(shape))
    xs = [1] * (r - len(xs)) + xs
    shape = [1] * (r - len(shape)) + shape
    out = tuple(b if (isinstance(a, int) and a == 1) else a for a, b in zip(xs, shape))
    return im.emit("expand", [x], shape=out)


@_reg("Tile")
def _tile(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("repeat", [im.tensor(ins[0])], repeats=tuple(im.known(ins[1], "Tile repeats").ints()))


@_reg("Slice")
def _slice(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    starts = im.known(ins[1], "Slice starts").ints()
    ends = im.known(ins[2], "Slice ends").ints()
    axes = im.known(ins[3], "Slice axes").ints() if len(ins) > 3 and ins[3] else list(range(len(starts)))
    steps = im.known(ins[4], "Slice steps").ints() if len(ins) > 4 and ins[4] else [1] * len(starts)
    k = im.maybe_known(ins[0])
    if k is not None and all(isinstance(v, int) for v in starts + ends):
        idx = [slice(None)] * k.array.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            idx[a] = slice(s, e, st)
        return Known(k.array[tuple(idx)], k.dtype)
    x = im.tensor(ins[0])
    r = _rank(x)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm(a, r)
        if st < 0:
            if s == -1 and isinstance(e, int) and e <= -(2**62) and st == -1:
                x = im.emit("flip", [x], dims=(a,))
                continue
            raise OnnxImportError("Slice with a negative step (other than a full reversal)")
        end = None if isinstance(e, int) and e >= 2**62 else e
        start = None if (isinstance(s, int) and s == 0) else s
        if start is None and end is None and st == 1:
            continue
        x = im.emit("slice", [x], dim=a, start=start, end=end, step=st)
    return x


@_reg("Split")
def _split(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = _norm(attrs.get("axis", 0), _rank(x))
    sizes = attrs.get("split")
    if sizes is None and len(ins) > 1 and ins[1]:
        sizes = im.known(ins[1], "Split sizes").ints()
    if sizes is None:
        n = len(node.output)
        d = x.type.shape[axis]  # type: ignore[union-attr]
        if not isinstance(d, int):
            raise OnnxImportError("Split into equal parts of a symbolic dim")
        size = -(-d // n)
        sizes = [size] * (n - 1) + [d - size * (n - 1)]
    out = im.emit("split", [x], dim=axis, sizes=tuple(sizes))
    return list(out) if isinstance(out, tuple) else [out]


@_reg("ConstantOfShape")
def _constant_of_shape(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    from onnx import numpy_helper

    shape = tuple(im.known(ins[0], "ConstantOfShape shape").ints())
    t = attrs.get("value")
    if t is not None:
        arr = numpy_helper.to_array(t)
        dt, value = to_dtype(t.data_type), arr.reshape(-1)[0].item()
    else:
        dt, value = DType.f32, 0.0
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape)) <= 64:
        return Known(np.full(shape, value, dtype=object), dt)
    return im.emit("full", [], shape=shape, value=_py(value, dt), dtype=dt, device=im.device)


@_reg("Range")
def _range(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    ks = [im.known(i, "Range bound") for i in ins]
    start, end, step = (_as_dim(k.array.reshape(-1)[0]) for k in ks)
    dt = ks[0].dtype
    if all(isinstance(v, (int, float)) for v in (start, end, step)) and abs((end - start) / step) <= 64:
        return Known(np.arange(start, end, step).astype(object), dt)
    return im.emit("arange", [], start=start, end=end, step=step, dtype=dt, device=im.device)


@_reg("Trilu")
def _trilu(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    k = int(im.known(ins[1], "Trilu k").array.reshape(-1)[0]) if len(ins) > 1 and ins[1] else 0
    return im.emit("triu" if attrs.get("upper", 1) else "tril", [im.tensor(ins[0])], diagonal=k)


@_reg("CumSum")
def _cumsum(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if attrs.get("exclusive", 0) or attrs.get("reverse", 0):
        raise OnnxImportError("CumSum with exclusive or reverse")
    x = im.tensor(ins[0])
    axis = int(im.known(ins[1], "CumSum axis").array.reshape(-1)[0])
    return im.emit("cumsum", [x], dim=_norm(axis, _rank(x)), dtype=None)


# -- reductions, normalization -------------------------------------------------------------
_REDUCE = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "amax",
    "ReduceMin": "amin",
    "ReduceProd": "prod",
    "ReduceLogSumExp": "logsumexp",
    "ReduceSumSquare": "sum",
    "ReduceL2": "sum",
}


@_reg(*_REDUCE)
def _reduce(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = _rank(x)
    axes = attrs.get("axes")
    if axes is None and len(ins) > 1 and ins[1]:
        axes = im.known(ins[1], f"{node.op_type} axes").ints()
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(r))
    keep = bool(attrs.get("keepdims", 1))
    dims = tuple(sorted(_norm(a, r) for a in axes))
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


@_reg("ArgMax", "ArgMin")
def _arg(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if attrs.get("select_last_index", 0):
        raise OnnxImportError("select_last_index=1")
    x = im.tensor(ins[0])
    return im.emit(
        node.op_type.lower(),
        [x],
        dim=_norm(attrs.get("axis", 0), _rank(x)),
        keepdim=bool(attrs.get("keepdims", 1)),
    )


@_reg("Softmax", "LogSoftmax")
def _softmax(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    axis = attrs.get("axis", -1 if im.opset >= 13 else 1)
    if im.opset < 13 and _norm(axis, _rank(x)) != _rank(x) - 1:
        raise OnnxImportError("Softmax before opset 13 over a non-last axis")
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    return im.emit(op, [x], dim=_norm(axis, _rank(x)), dtype=None)


@_reg("LayerNormalization")
def _layer_norm(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    if len(node.output) > 1 and any(node.output[1:]):
        raise OnnxImportError("LayerNormalization with mean/inv_std_dev outputs")
    x = im.tensor(ins[0])
    r = _rank(x)
    axis = _norm(attrs.get("axis", -1), r)
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


@_reg("BatchNormalization")
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


@_reg("MatMul")
def _matmul(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    return im.emit("matmul", [im.tensor(ins[0]), im.tensor(ins[1])])


@_reg("Gemm")
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
    auto = _s(attrs.get("auto_pad", "NOTSET"))
    if auto not in ("NOTSET", "VALID"):
        raise OnnxImportError(f"auto_pad={auto}")
    pads = list(attrs.get("pads") or [0] * (2 * k))
    if pads[:k] != pads[k:]:
        raise OnnxImportError(f"asymmetric pads {pads}")
    return tuple(pads[:k])


@_reg("Conv", "ConvTranspose")
def _conv(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x, w = im.tensor(ins[0]), im.tensor(ins[1])
    k = _rank(w) - 2
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


@_reg("MaxPool", "AveragePool")
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


@_reg("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    dims = tuple(range(2, _rank(x)))
    if node.op_type == "GlobalAveragePool":
        return im.emit("mean", [x], dims=dims, keepdim=True, dtype=None)
    return im.emit("amax", [x], dims=dims, keepdim=True)


@_reg("Pad")
def _pad(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = _rank(x)
    pads = im.known(ins[1], "Pad pads").ints() if len(ins) > 1 and ins[1] else list(attrs.get("pads", []))
    if len(ins) > 3 and ins[3]:
        raise OnnxImportError("Pad with axes")
    value: Any = 0.0
    if len(ins) > 2 and ins[2]:
        value = _as_dim(im.known(ins[2], "Pad value").array.reshape(-1)[0])
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[
        _s(attrs.get("mode", "constant"))
    ]
    torch_pad: list[Any] = []
    for i in reversed(range(r)):
        torch_pad += [pads[i], pads[r + i]]
    while len(torch_pad) > 2 and torch_pad[-2:] == [0, 0]:
        torch_pad = torch_pad[:-2]
    return im.emit("pad", [x], pad=tuple(torch_pad), mode=mode, value=value if mode == "constant" else None)


@_reg("Resize")
def _resize(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    x = im.tensor(ins[0])
    r = _rank(x)
    mode = _s(attrs.get("mode", "nearest"))
    ctm = _s(attrs.get("coordinate_transformation_mode", "half_pixel"))
    scales = im.known(ins[2], "Resize scales").array.reshape(-1).tolist() if len(ins) > 2 and ins[2] else []
    sizes = im.known(ins[3], "Resize sizes").ints() if len(ins) > 3 and ins[3] else []
    if mode == "nearest":
        if ctm != "asymmetric" or _s(attrs.get("nearest_mode", "round_prefer_floor")) != "floor":
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


# -- control flow ---------------------------------------------------------------------------
def _known_scalar(k: Known | None) -> Any:
    """The single element of a known one-element value (an int, bool, float or size
    expression), or ``None``."""
    if k is None or k.array.size != 1:
        return None
    v = k.array.reshape(-1)[0]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return _as_dim(v)


def _predicate(im: Importer, name: str) -> Value:
    """A 0-d bool tensor holding the truth of one-element value ``name``."""
    v = im.tensor(name)
    t = v.type
    if not isinstance(t, TensorType):
        raise OnnxImportError(f"condition {name!r} is not a tensor ({t})")
    if t.dtype != DType.bool:
        v = im.emit("cast", [v], dtype=DType.bool)
    if t.rank:
        v = im.emit("reshape", [v], shape=())
    return v


def _check_carried(node: Any, what: str, got: Sequence[Value], want: Sequence[Type]) -> None:
    from cuvil_ir.graph_ir.verifier import types_equal

    for i, (v, t) in enumerate(zip(got, want)):
        if not types_equal(v.type, t):
            raise OnnxImportError(
                f"{node.op_type} node {node.name!r}: {what} #{i} has type {v.type}, expected {t} "
                "(loop-carried values must keep their type)"
            )


def _uses(g: Any, name: str) -> bool:
    """Does subgraph ``g`` (or one nested in it) read the value ``name``?"""
    for n in g.node:
        if name in n.input:
            return True
        for a in n.attribute:
            if a.HasField("g") and _uses(a.g, name):
                return True
            if any(_uses(sub, name) for sub in a.graphs):
                return True
    return name in {o.name for o in g.output}


def _passes_through(g: Any, src: str, dst: str) -> bool:
    """Is ``dst`` in subgraph ``g`` the value ``src`` (through Identity nodes) or a constant true?"""
    producers = {o: n for n in g.node for o in n.output}
    seen = 0
    while dst != src and seen < 64:
        n = producers.get(dst)
        if n is None:
            return False
        if n.op_type == "Identity":
            dst = n.input[0]
        elif n.op_type == "Constant":
            from onnx import numpy_helper

            vals = [numpy_helper.to_array(a.t) for a in n.attribute if a.name == "value"]
            return len(vals) == 1 and vals[0].size == 1 and bool(vals[0].reshape(-1)[0])
        else:
            return False
        seen += 1
    return dst == src


@_reg("If")
def _if_node(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    then_g, else_g = attrs["then_branch"], attrs["else_branch"]
    c = _known_scalar(im.maybe_known(ins[0]))
    if c is not None:
        # Known when importing (a constant or a size predicate): the branch is chosen
        # now; a size predicate becomes an assumption of the graph (another call whose
        # sizes decide it the other way builds another graph).
        if isinstance(c, sympy.Basic) and not isinstance(c, (sympy.logic.boolalg.BooleanAtom)):
            if isinstance(c, sympy.Expr):
                c = sympy.Ne(c, 0)
            taken = im.ctx.decide(c, f"If node {node.name!r}: the branch taken")
        else:
            taken = bool(c)
        return im.inline(then_g if taken else else_g)
    pred = _predicate(im, ins[0])
    then_nodes, then_res = im.block(then_g, {})
    else_nodes, else_res = im.block(else_g, {})
    if len(then_res) != len(else_res):
        raise OnnxImportError(f"the branches yield {len(then_res)} and {len(else_res)} values")
    from cuvil_ir.graph_ir.verifier import types_equal

    for i, (a, b) in enumerate(zip(then_res, else_res)):
        if not types_equal(a.type, b.type):
            raise OnnxImportError(
                f"output #{i}: the branches yield different types {a.type} and {b.type} "
                "(a tensor condition needs branches of one type)"
            )
    outs = tuple(im.fresh(v.type) for v in then_res)
    regions = (Block((), then_nodes, tuple(then_res)), Block((), else_nodes, tuple(else_res)))
    im.nodes.append(Node("if", (pred,), outs, (), regions))
    return list(outs)


@_reg("Loop")
def _loop_node(im: Importer, node: Any, ins: list[str], attrs: dict[str, Any]) -> Any:
    body = attrs["body"]
    m_name = ins[0] if ins else ""
    c_name = ins[1] if len(ins) > 1 else ""
    carried = ins[2:]
    b_ins = [i.name for i in body.input]
    b_outs = [o.name for o in body.output]
    if len(b_ins) != 2 + len(carried) or len(b_outs) < 1 + len(carried):
        raise OnnxImportError(
            f"the body takes {len(b_ins)} inputs and yields {len(b_outs)} outputs for {len(carried)} "
            "loop-carried values"
        )
    if len(b_outs) > 1 + len(carried):
        scans = [o for o in node.output[len(carried) :] if o] or b_outs[1 + len(carried) :]
        raise OnnxImportError(f"scan outputs {scans} are not supported (only loop-carried values)")
    init = [im.tensor(c) for c in carried]
    trips = _known_scalar(im.maybe_known(m_name)) if m_name else None
    cond_true = not c_name or _known_scalar(im.maybe_known(c_name)) is True
    if trips is not None and cond_true and _passes_through(body, b_ins[1], b_outs[0]):
        return _as_for(im, node, body, trips, init)
    return _as_while(im, node, body, m_name, c_name, init)


def _as_for(im: Importer, node: Any, body: Any, trips: Any, init: list[Value]) -> list[Value]:
    """``Loop(M, true)`` whose body passes the condition on: ``for i in range(M)``."""
    b_ins = [i.name for i in body.input]
    types = [v.type for v in init]
    if isinstance(trips, sympy.Basic):
        trips = _as_dim(sympy.simplify(trips))
    if isinstance(trips, int):
        trips = max(trips, 0)  # a negative trip count runs no iteration
    if isinstance(trips, sympy.Basic) and not trips.is_integer:
        raise OnnxImportError(f"the trip count {trips} is not an integer size expression")
    im.counter += 1
    var = symbol(f"onnx_loop{im.counter}")
    assert im.ctx.hints is not None
    im.ctx.hints[var] = 0
    im.ctx.local_symbols[var] = (0, trips - 1)
    args = [im.fresh(t) for t in types]
    bind: dict[str, Value | Known] = {
        b_ins[0]: Known(np.array(var, dtype=object), DType.i64),
        b_ins[1]: Known(np.array(True), DType.bool),
    }
    bind.update(zip(b_ins[2:], args))
    try:
        nodes, results = im.block(body, bind)
    finally:
        del im.ctx.local_symbols[var]
    results = results[1:]
    _check_carried(node, "loop-carried output", results, types)
    bounds = [im.emit("const", [], value=b) for b in (0, trips, 1)]
    outs = tuple(im.fresh(t) for t in types)
    im.nodes.append(
        Node(
            "for", (*bounds, *init), outs, (("var", var.name),), (Block(tuple(args), nodes, tuple(results)),)
        )
    )
    return list(outs)


def _as_while(im: Importer, node: Any, body: Any, m_name: str, c_name: str, init: list[Value]) -> list[Value]:
    """Any other ``Loop``: a ``while`` carrying the condition (and the iteration number
    when the body reads it or a trip count bounds the loop) next to the values."""
    b_ins = [i.name for i in body.input]
    counted = bool(m_name) or _uses(body, b_ins[0])
    i64, bool_t = TensorType(DType.i64, (), im.device), TensorType(DType.bool, (), im.device)
    pre: list[Value] = []
    if counted:
        pre.append(im.emit("full", [], shape=(), value=0, dtype=DType.i64, device=im.device))
    if c_name:
        pre.append(_predicate(im, c_name))
    else:
        pre.append(im.emit("full", [], shape=(), value=True, dtype=DType.bool, device=im.device))
    trips = _trip_tensor(im, m_name) if m_name else None
    n_pre = len(pre)
    types: list[Type] = [v.type for v in pre] + [v.type for v in init]
    assert types[n_pre - 1] == bool_t and (not counted or types[0] == i64)

    # condition: the carried condition (and the counter below the trip count)
    cargs = [im.fresh(t) for t in types]
    saved = im.nodes
    im.nodes = []
    try:
        pred = cargs[n_pre - 1]
        if trips is not None:
            below = im.emit("lt", [cargs[0], trips])
            pred = im.emit("logical_and", [pred, below])
        cond_block = Block(tuple(cargs), tuple(im.nodes), (pred,))
    finally:
        im.nodes = saved

    # body: the ONNX body, then the counter + 1
    bargs = [im.fresh(t) for t in types]
    bind: dict[str, Value | Known] = {b_ins[1]: bargs[n_pre - 1]}
    if counted:
        bind[b_ins[0]] = bargs[0]
    bind.update(zip(b_ins[2:], bargs[n_pre:]))
    nodes, results = im.block(body, bind)
    saved = im.nodes
    im.nodes = list(nodes)
    try:
        nxt = [_coerce_pred(im, results[0])]
        if counted:
            one = im.emit("full", [], shape=(), value=1, dtype=DType.i64, device=im.device)
            nxt.insert(0, im.emit("add", [bargs[0], one]))
        nxt += results[1:]
        body_block = Block(tuple(bargs), tuple(im.nodes), tuple(nxt))
    finally:
        im.nodes = saved
    _check_carried(node, "loop-carried output", nxt[n_pre:], types[n_pre:])
    outs = tuple(im.fresh(t) for t in types)
    im.nodes.append(Node("while", (*pre, *init), outs, (), (cond_block, body_block)))
    return list(outs[n_pre:])


def _trip_tensor(im: Importer, name: str) -> Value:
    """The trip count ``name`` as a 0-d int64 tensor."""
    v = im.tensor(name)
    if _dtype(v) != DType.i64:
        v = im.emit("cast", [v], dtype=DType.i64)
    if _rank(v):
        v = im.emit("reshape", [v], shape=())
    return v


def _coerce_pred(im: Importer, v: Value) -> Value:
    """The body's condition output as a 0-d bool tensor (the carried condition's type)."""
    if _dtype(v) != DType.bool:
        v = im.emit("cast", [v], dtype=DType.bool)
    if _rank(v):
        v = im.emit("reshape", [v], shape=())
    return v


# -- the callable ---------------------------------------------------------------------------
def _load(model_or_path: Any) -> Any:
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model_or_path))
    if isinstance(model_or_path, (str, os.PathLike)):
        return onnx.load(os.fspath(model_or_path))
    raise TypeError(
        f"compile_onnx expects an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}"
    )


class OnnxFunction:
    """An ONNX model compiled by Cuvil (see :func:`cuvil.compile_onnx`)."""

    def __init__(
        self, model_or_path: Any, target: str | None = None, device: str = "cpu", **compile_kwargs: Any
    ) -> None:
        from cuvil_runtime.registry import default_target, get_target
        from cuvil_runtime.target import CompileOptions

        self.model = _load(model_or_path)
        g = self.model.graph
        inits = {i.name for i in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.output_names = [o.name for o in g.output]
        self.device = device
        self.target = target if target is not None else default_target(device)
        self._target = get_target(self.target)
        if device not in self._target.capabilities.devices:
            raise ValueError(
                f"target {self.target!r} does not run on {device!r} tensors (it runs on "
                f"{', '.join(sorted(self._target.capabilities.devices))}); pass device= or another target"
            )
        self.options = CompileOptions(**compile_kwargs)
        #: per input: (dtype, dims) with dims ints or size symbols
        self.signature: list[tuple[DType, tuple[Any, ...]]] = []
        names: dict[str, sympy.Symbol] = {}
        for vi in (i for i in g.input if i.name not in inits):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise OnnxImportError(f"model input {vi.name!r} is not a tensor")
            dims: list[Any] = []
            for j, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:
                    key = d.dim_param or f"{vi.name}_{j}"
                    if key not in names:
                        names[key] = _sym(_ident(key, "d"))
                    dims.append(names[key])
            self.signature.append((to_dtype(tt.elem_type), tuple(dims)))
        self._artifacts: list[tuple[Graph, Any, list[torch.Tensor]]] = []
        self.stats_compiles = 0

    @property
    def graphs(self) -> list[Graph]:
        return [a[0] for a in self._artifacts]

    def _bind(self, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
        if len(args) != len(self.signature):
            raise TypeError(
                f"the ONNX model takes {len(self.signature)} inputs {self.input_names}, got {len(args)}"
            )
        bindings: dict[sympy.Symbol, int] = {}
        for name, a, (dt, dims) in zip(self.input_names, args, self.signature):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"input {name!r} must be a torch.Tensor, got {type(a).__name__}")
            if a.dim() != len(dims):
                raise ValueError(f"input {name!r} must have rank {len(dims)}, got shape {tuple(a.shape)}")
            if a.dtype != dt.torch:
                raise TypeError(f"input {name!r} must be {dt.torch}, got {a.dtype}")
            for j, (d, n) in enumerate(zip(dims, a.shape)):
                if isinstance(d, int):
                    if d != n:
                        raise ValueError(f"input {name!r} dim {j} must be {d}, got {n}")
                elif bindings.setdefault(d, int(n)) != n:
                    raise ValueError(f"input {name!r} dim {j} ({d}) must be {bindings[d]}, got {n}")
        return bindings

    def build(self, bindings: dict[sympy.Symbol, int]) -> tuple[Graph, list[torch.Tensor]]:
        from cuvil_ir.graph_ir.verifier import verify

        types = [TensorType(dt, dims, self.device) for dt, dims in self.signature]
        im = Importer(self.model, bindings, types, self.device)
        graph = im.run()
        verify(graph)
        return graph, im.consts

    def __call__(self, *args: Any) -> Any:
        bindings = self._bind(args)
        for art in self._artifacts:
            if all(evaluate_bool(a, bindings) for a in art[0].assumptions):
                graph, exe, consts = art
                break
        else:
            graph, consts = self.build(bindings)
            from cuvil_runtime.dump import compile_graph

            exe = compile_graph(self._target, graph, self.options)
            self._artifacts.append((graph, exe, consts))
            self.stats_compiles += 1
        outs = exe(*args, *consts)
        outs = tuple(outs)
        return outs[0] if len(outs) == 1 else outs

    def __repr__(self) -> str:
        return f"<cuvil compiled ONNX model {self.model.graph.name!r} target={self.target}>"
