"""Graph IR -> ONNX (``onnx.ModelProto``).

Every Graph IR value becomes an ONNX value; every node becomes one or a few ONNX
nodes (the table :data:`OPS`). Size symbols are read once from the graph inputs
(``Shape(x, start=i, end=i+1)``) and size expressions in attributes and ``const``
nodes are computed from them with integer ONNX arithmetic, so the model keeps
the graph's dynamic axes; graph input and output dims are ``dim_param`` s named
after the symbols (``x_0``). ``if`` becomes ``If``; ``for`` and ``while`` become
``Loop``. Python scalars (``Scalar[...]``) are 0-d tensors (int64, double, bool),
cast to the operand dtype at each use, as torch's weak-scalar promotion does.

The output is deterministic: value and node names are numbered in program order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil.onnx.functions import custom_domain_node
from cuvil_ir.graph_ir.decompose import NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.nodes import Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, registrar
from cuvil_ir.graph_ir.types import (
    DType,
    ScalarKind,
    ScalarType,
    TensorType,
    Type,
    element_dtype,
    promote_types,
)
from cuvil_ir.symbolic import expr_str

OPSET = 18
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class ExportError(NotImplementedError):
    """A Graph IR node that has no ONNX translation (names the op and, when known, where)."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ONNX support needs the onnx package: pip install 'cuvil[onnx]'") from e
    return onnx


def onnx_dtype(dt: DType) -> int:
    tp = _onnx().TensorProto
    return {
        DType.bool: tp.BOOL,
        DType.u8: tp.UINT8,
        DType.i8: tp.INT8,
        DType.i16: tp.INT16,
        DType.i32: tp.INT32,
        DType.i64: tp.INT64,
        DType.f16: tp.FLOAT16,
        DType.bf16: tp.BFLOAT16,
        DType.f32: tp.FLOAT,
        DType.f64: tp.DOUBLE,
        DType.c64: tp.COMPLEX64,
        DType.c128: tp.COMPLEX128,
    }[dt]


dtype_of = element_dtype


class _Scope:
    """One ONNX graph being built: the top level or a subgraph (branch, loop body)."""

    def __init__(self, parent: _Scope | None) -> None:
        self.parent = parent
        self.nodes: list[Any] = []
        self.cache: dict[Any, str] = {}
        self.syms: dict[sympy.Symbol, str] = {}

    def lookup(self, key: Any) -> str | None:
        s: _Scope | None = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None

    def sym(self, s: sympy.Symbol) -> str | None:
        sc: _Scope | None = self
        while sc is not None:
            if s in sc.syms:
                return sc.syms[s]
            sc = sc.parent
        return None


class Exporter:
    def __init__(self, opset: int = OPSET) -> None:
        self.onnx = _onnx()
        self.opset = opset
        self.counter = 0
        self.node_counter = 0
        self.env: dict[Value, str] = {}
        self.scope = _Scope(None)
        self.top = self.scope
        #: the Shape nodes that read size symbols, placed first in the top-level graph
        self.prologue = _Scope(None)
        #: symbol -> (graph input name, axis) it is read from
        self.sources: dict[sympy.Symbol, tuple[str, int]] = {}
        #: expression outputs computed in double precision (non-integer size expressions)
        self.floats: set[str] = set()
        #: symbols the graph's assumptions pin to a value
        self.known: dict[sympy.Symbol, int] = {}
        #: the graph's assumptions (decompositions infer their types under them)
        self.assumptions: tuple[sympy.Basic, ...] = ()
        #: ONNX value -> the Python number of a ``const`` node it holds, so that a use in
        #: float arithmetic gets a constant of its dtype rather than a ``Cast``
        self.numbers: dict[str, float] = {}
        #: custom ops as custom-domain nodes and functions (:mod:`cuvil.onnx.functions`)
        self.custom_domain = False
        #: (domain, name, overload) -> FunctionProto
        self.functions: dict[tuple[str, str, str], Any] = {}

    # -- building blocks ---------------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> Any:
        outs = [self.fresh() for _ in range(n_out)]
        self.node_counter += 1
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = self.onnx.helper.make_node(
            op_type, list(inputs), outs, name=f"n{self.node_counter}_{op_type}", **attrs
        )
        self.scope.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, value: Any, dt: DType, shape: Sequence[int] | None = None) -> str:
        """A constant tensor (0-d for a Python number; ``shape`` for a list)."""
        vals = list(value) if isinstance(value, (list, tuple)) else [value]
        shp = (
            list(shape)
            if shape is not None
            else ([] if not isinstance(value, (list, tuple)) else [len(vals)])
        )
        key = ("const", dt, tuple(shp), tuple((type(v).__name__, v) for v in vals))
        hit = self.scope.lookup(key)
        if hit is not None:
            return hit
        if dt == DType.bool:
            vals = [bool(v) for v in vals]
        elif dt.is_integer:
            vals = [int(v) for v in vals]
        else:
            vals = [float(v) for v in vals]
        tensor = self.onnx.helper.make_tensor("value", onnx_dtype(dt), shp, vals)
        name = self.op("Constant", [], value=tensor)
        self.scope.cache[key] = name
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const([int(v) for v in values], DType.i64, [len(values)])

    def cast(self, name: str, src: DType, dst: DType) -> str:
        if src == dst:
            return name
        return self.op("Cast", [name], to=onnx_dtype(dst))

    def val(self, v: Value, dst: DType | None = None) -> str:
        name = self.env[v]
        if dst is None:
            return name
        if name in self.numbers and dst in (DType.f32, DType.f64) and dtype_of(v.type) != dst:
            return self.const(self.numbers[name], dst)
        return self.cast(name, dtype_of(v.type), dst)

    # -- size expressions -------------------------------------------------------------
    def expr(self, e: Any) -> str:
        """An int64 (or bool) tensor of shape [1] holding the size expression ``e``."""
        if isinstance(e, bool):
            return self.const([e], DType.bool, [1])
        if isinstance(e, int):
            return self.const([e], DType.i64, [1])
        e = sympy.sympify(e)
        if e.is_Integer:
            return self.const([int(e)], DType.i64, [1])
        if e in (sympy.true, sympy.false):
            return self.const([bool(e)], DType.bool, [1])
        key = ("expr", e)
        hit = self.scope.lookup(key)
        if hit is not None:
            return hit
        out = self._expr(e)
        self.scope.cache[key] = out
        return out

    def _expr(self, e: Any) -> str:
        if isinstance(e, sympy.Symbol):
            name = self.scope.sym(e)
            if name is None:
                src = self.sources.get(e)
                if src is None:
                    raise ExportError(f"size symbol {e} is not bound by a graph input or loop")
                # read once, in the prologue of the top-level graph (visible everywhere)
                scope, self.scope = self.scope, self.prologue
                try:
                    name = self.op("Shape", [src[0]], start=src[1], end=src[1] + 1)
                finally:
                    self.scope = scope
                self.top.syms[e] = name
            return name
        if e.is_integer is not True and not _is_bool(e):
            return self._float_expr(e)
        return self._int_expr(e)

    def _int_expr(self, e: Any) -> str:
        if isinstance(e, sympy.Add):
            terms = [self.expr(a) for a in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = self.op("Add", [out, t])
            return out
        if isinstance(e, sympy.Mul):
            num, den = e.as_numer_denom()
            if den != 1:
                return self.op("Div", [self.expr(num), self.expr(den)])
            factors = [self.expr(a) for a in e.args]
            out = factors[0]
            for f in factors[1:]:
                out = self.op("Mul", [out, f])
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base = self.expr(e.base)
            out = base
            for _ in range(int(e.exp) - 1):
                out = self.op("Mul", [out, base])
            return out
        if isinstance(e, sympy.floor):
            num, den = e.args[0].as_numer_denom()
            return self.op("Div", [self.expr(num), self.expr(den)])
        if isinstance(e, sympy.ceiling):
            num, den = e.args[0].as_numer_denom()
            return self.op("Div", [self.op("Add", [self.expr(num), self.expr(den - 1)]), self.expr(den)])
        if isinstance(e, sympy.Mod):
            return self.op("Mod", [self.expr(e.args[0]), self.expr(e.args[1])])
        if isinstance(e, (sympy.Max, sympy.Min)):
            out = self.op("Max" if isinstance(e, sympy.Max) else "Min", [self.expr(a) for a in e.args])
            # already of shape [1]; the Reshape keeps it so for load.py, whose Max/Min fold
            # of one-element known values gives a 0-d value
            return self.op("Reshape", [out, self.ints([1])])
        rel = {
            sympy.StrictLessThan: "Less",
            sympy.LessThan: "LessOrEqual",
            sympy.StrictGreaterThan: "Greater",
            sympy.GreaterThan: "GreaterOrEqual",
            sympy.Equality: "Equal",
        }
        for cls, op_type in rel.items():
            if isinstance(e, cls):
                return self.op(op_type, [self.expr(e.lhs), self.expr(e.rhs)])
        if isinstance(e, sympy.Unequality):
            return self.op("Not", [self.op("Equal", [self.expr(e.lhs), self.expr(e.rhs)])])
        if isinstance(e, (sympy.And, sympy.Or)):
            parts = [self.expr(a) for a in e.args]
            out = parts[0]
            for p in parts[1:]:
                out = self.op("And" if isinstance(e, sympy.And) else "Or", [out, p])
            return out
        if isinstance(e, sympy.Not):
            return self.op("Not", [self.expr(e.args[0])])
        if isinstance(e, sympy.Piecewise):
            *pairs, (last, _) = e.args
            out = self.expr(last)
            for value, cond in reversed(pairs):
                out = self.op("Where", [self.expr(cond), self.expr(value), out])
            return out
        raise ExportError(f"size expression {expr_str(e)} has no ONNX translation")

    def _float_expr(self, e: Any) -> str:
        """A non-integer size expression (``x_2**(-0.5)``), in double precision."""

        def f(a: Any) -> str:
            if a.is_Number:
                return self.const([float(a)], DType.f64, [1])
            if isinstance(a, sympy.Add):
                parts = [f(x) for x in a.args]
                op_type = "Add"
            elif isinstance(a, sympy.Mul):
                parts = [f(x) for x in a.args]
                op_type = "Mul"
            elif isinstance(a, sympy.Pow):
                return self.op("Pow", [f(a.base), f(a.exp)])
            else:
                name = self._int_expr(a) if not isinstance(a, sympy.Symbol) else self.expr(a)
                return name if name in self.floats else self.cast(name, DType.i64, DType.f64)
            out = parts[0]
            for p in parts[1:]:
                out = self.op(op_type, [out, p])
            return out

        out = f(e)
        self.floats.add(out)
        return out

    def scalar_expr(self, e: Any, dt: DType = DType.i64) -> str:
        """A 0-d tensor of dtype ``dt`` holding the size expression ``e``."""
        ex = self.expr(e)
        name = self.op("Squeeze", [ex, self.ints([0])])
        src = DType.bool if _is_bool(e) else (DType.f64 if ex in self.floats else DType.i64)
        return self.cast(name, src, dt)

    def dims(self, shape: Sequence[Any]) -> str:
        """A 1-D int64 tensor of the dims ``shape`` (ints or size expressions)."""
        if all(isinstance(d, int) for d in shape):
            return self.ints(shape)
        return self.op("Concat", [self.expr(d) for d in shape], axis=0)

    # -- graphs -----------------------------------------------------------------------
    def value_info(self, name: str, t: Type, *, shapes: bool = True) -> Any:
        helper = self.onnx.helper
        if isinstance(t, ScalarType):
            return helper.make_tensor_value_info(name, onnx_dtype(dtype_of(t)), [])
        dims: list[Any] = []
        for d in t.shape:
            if isinstance(d, sympy.Basic) and self.known:
                d = sympy.sympify(d.xreplace(self.known))
                d = int(d) if d.is_Integer else d
            if not shapes:
                dims.append(None)
            elif isinstance(d, int):
                dims.append(d)
            elif isinstance(d, sympy.Symbol):
                dims.append(d.name)
            else:
                dims.append(expr_str(d))
        return helper.make_tensor_value_info(name, onnx_dtype(t.dtype), dims)

    def block(self, nodes: Sequence[Node]) -> None:
        for n in nodes:
            fn = OPS.get(n.op)
            outs = None
            if self.custom_domain and n.op in REGISTRY and "composite" in REGISTRY.get(n.op).traits:
                outs = custom_domain_node(self, n)  # None: its body is not closed, inline it
            elif fn is not None:
                try:
                    outs = fn(self, n)  # None: no native form here, use the decomposition
                except ExportError:
                    raise
                except Exception as e:
                    raise ExportError(f"exporting {n.op}{f' at {n.loc}' if n.loc else ''}: {e}") from e
            if outs is None:
                outs = self.decomposed(n)
            if isinstance(outs, str):
                outs = [outs]
            for v, name in zip(n.outputs, outs):
                self.env[v] = name

    def decomposed(self, n: Node) -> list[str]:
        """``n`` exported as its decomposition's primitives (see
        :mod:`cuvil_ir.graph_ir.decompose`), or an :class:`ExportError` naming the op and
        the reason its declaration gives."""
        where = f" (at {n.loc})" if n.loc else ""
        if not uses_decomposition(n.op, "onnx", native=False):
            extra = f" {_a(n, 'target')}" if n.op == "extern" else ""
            reason = REGISTRY.get(n.op).extern_reasons.get("onnx") if n.op in REGISTRY else None
            why = f": {reason}" if reason else ""
            raise ExportError(f"Graph IR op {n.op!r}{extra}{where} has no ONNX translation{why}")
        try:
            ex = expand(n, self.assumptions)
        except NotDecomposed as e:
            raise ExportError(f"exporting {n.op}{where}: {e}") from e
        self.block(ex.nodes)
        return [self.env[v] for v in ex.outputs]

    def subgraph(
        self, name: str, inputs: Sequence[tuple[str, Type]], body: Callable[[], Sequence[tuple[str, Type]]]
    ) -> Any:
        parent = self.scope
        self.scope = _Scope(parent)
        try:
            results = body()
            outs = []
            for r, t in results:
                o = self.op("Identity", [r])
                outs.append(self.value_info(o, t, shapes=False))
            ins = [self.value_info(n, t, shapes=False) for n, t in inputs]
            return self.onnx.helper.make_graph(self.scope.nodes, name, ins, outs)
        finally:
            self.scope = parent


def _is_bool(e: Any) -> bool:
    if isinstance(e, bool):
        return True
    return isinstance(e, sympy.Basic) and ScalarKind.of(e) == ScalarKind.bool


def export_graph(
    graph: Graph,
    *,
    initializers: dict[str, Any] | None = None,
    outputs: Sequence[int] | None = None,
    opset: int = OPSET,
    producer: str = "cuvil",
    custom_ops: str = "inline",
) -> Any:
    """``graph`` as an ONNX model. ``initializers`` maps graph input names to tensors stored
    in the model (module weights) instead of being model inputs; ``outputs`` picks and
    orders the graph outputs (default: all, in order). ``custom_ops="domain"`` writes
    each custom op as a node of its namespace's domain with its decomposition as a
    model-local function (:mod:`cuvil.onnx.functions`); ``"inline"`` writes the
    decomposition in its place."""
    import numpy as np

    if custom_ops not in ("inline", "domain"):
        raise ValueError(f"custom_ops is 'inline' or 'domain', got {custom_ops!r}")
    ex = Exporter(opset)
    ex.custom_domain = custom_ops == "domain"
    onnx = ex.onnx
    initializers = initializers or {}
    inputs = []
    inits = []
    for v in graph.inputs:
        name = v.name
        ex.env[v] = name
        if name in initializers:
            t = initializers[name].detach().cpu()
            if t.dtype == _bf16():
                arr = t.float().numpy()
                tp = onnx.helper.make_tensor(
                    name, onnx.TensorProto.BFLOAT16, arr.shape, arr.flatten().tolist()
                )
            else:
                tp = onnx.numpy_helper.from_array(np.ascontiguousarray(t.numpy()), name)
            inits.append(tp)
        else:
            inputs.append(ex.value_info(name, v.type))
    # size symbols: read (lazily, into the prologue) from the first input that has them
    for v in graph.inputs:
        if isinstance(v.type, TensorType):
            for i, d in enumerate(v.type.shape):
                if isinstance(d, sympy.Symbol) and d not in ex.sources:
                    ex.sources[d] = (v.name, i)
    ex.known = _pinned(graph.assumptions)
    ex.assumptions = tuple(graph.assumptions)
    ex.block(graph.nodes)
    picks = list(range(len(graph.outputs))) if outputs is None else list(outputs)
    out_infos = []
    seen: set[str] = set()
    input_names = {v.name for v in graph.inputs}
    for i in picks:
        v = graph.outputs[i]
        name = ex.env[v]
        if name in seen or name in input_names:
            name = ex.op("Identity", [name])
        seen.add(name)
        out_infos.append(ex.value_info(name, v.type))
    nodes = ex.prologue.nodes + ex.scope.nodes
    g = onnx.helper.make_graph(nodes, _ident(graph.name) or "main", inputs, out_infos, initializer=inits)
    if graph.assumptions:
        g.doc_string = "valid when: " + "; ".join(expr_str(a) for a in graph.assumptions)
    domains = sorted({d for d, _, _ in ex.functions})
    model = onnx.helper.make_model(
        g,
        opset_imports=[
            onnx.helper.make_opsetid("", opset),
            *(onnx.helper.make_opsetid(d, 1) for d in domains),
        ],
        producer_name=producer,
        ir_version=10 if ex.functions else 9,  # function overloads need IR 10
        functions=[ex.functions[k] for k in sorted(ex.functions)],
    )
    if graph.assumptions:
        onnx.helper.set_model_props(
            model, {"cuvil.assumptions": "; ".join(expr_str(a) for a in graph.assumptions)}
        )
    return model


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _pinned(assumptions: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """Symbols an assumption pins to a value (``Eq(x_1, 16)``): exported as fixed dims."""
    out: dict[sympy.Symbol, int] = {}
    for fact in assumptions:
        if isinstance(fact, sympy.Eq):
            for a, b in ((fact.lhs, fact.rhs), (fact.rhs, fact.lhs)):
                if isinstance(a, sympy.Symbol) and b.is_Integer:
                    out[a] = int(b)
    return out


def _bf16() -> Any:
    import torch

    return torch.bfloat16


# -- the op table ------------------------------------------------------------------------
OpFn = Callable[[Exporter, Node], Any]
OPS: dict[str, OpFn] = {}


_reg = registrar(OPS)


def _a(n: Node, name: str) -> Any:
    """An attribute of ``n`` (typed loosely: each op's schema says what it holds)."""
    return n.attr(name)


def _out(n: Node) -> TensorType:
    t = n.outputs[0].type
    assert isinstance(t, TensorType)
    return t


def _tt(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise ExportError(f"expected a tensor, got {t}")
    return t


_UNARY = {
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
    "hardswish": "HardSwish",
    "mish": "Mish",
}


def _unary(onnx_op: str) -> OpFn:
    def fn(ex: Exporter, n: Node) -> Any:
        return ex.op(onnx_op, [ex.val(n.inputs[0], _out(n).dtype)])

    return fn


for _k, _v in _UNARY.items():
    OPS[_k] = _unary(_v)


def _fconst(ex: Exporter, value: float, dt: DType) -> str:
    return ex.const(value, dt)


@_reg("rsqrt", "log1p", "expm1", "log2", "square", "trunc", "hardsigmoid")
def _unary_composite(ex: Exporter, n: Node) -> Any:
    """Primitives ONNX spells with a few nodes (and its native HardSigmoid)."""
    dt = _out(n).dtype
    x = ex.val(n.inputs[0], dt)
    if n.op == "rsqrt":
        return ex.op("Reciprocal", [ex.op("Sqrt", [x])])
    if n.op == "log1p":
        return ex.op("Log", [ex.op("Add", [x, _fconst(ex, 1.0, dt)])])
    if n.op == "expm1":
        return ex.op("Sub", [ex.op("Exp", [x]), _fconst(ex, 1.0, dt)])
    if n.op == "log2":
        return ex.op("Div", [ex.op("Log", [x]), _fconst(ex, math.log(2.0), dt)])
    if n.op == "square":
        return ex.op("Mul", [x, x])
    if n.op == "trunc":
        if not dt.is_floating:
            return ex.op("Identity", [x])
        neg = ex.op("Less", [x, _fconst(ex, 0.0, dt)])
        return ex.op("Where", [neg, ex.op("Ceil", [x]), ex.op("Floor", [x])])
    return ex.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)


@_reg("gelu")
def _gelu(ex: Exporter, n: Node) -> Any:
    if ex.opset < 20:
        return None  # no Gelu before opset 20: the decomposition
    return ex.op("Gelu", [ex.val(n.inputs[0], _out(n).dtype)], approximate=str(_a(n, "approximate")))


@_reg("leaky_relu")
def _leaky(ex: Exporter, n: Node) -> Any:
    return ex.op("LeakyRelu", [ex.val(n.inputs[0], _out(n).dtype)], alpha=float(_a(n, "negative_slope")))


@_reg("elu")
def _elu(ex: Exporter, n: Node) -> Any:
    return ex.op("Elu", [ex.val(n.inputs[0], _out(n).dtype)], alpha=float(_a(n, "alpha")))


@_reg("round")
def _round(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    x = ex.val(n.inputs[0], dt)
    d = int(_a(n, "decimals") or 0)
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


@_reg(*_ARITH, *_CMP, "ne", *_LOGICAL, *_BITWISE, "floor_divide", "remainder", "fmod", "atan2")
def _binary(ex: Exporter, n: Node) -> Any:
    a, b = n.inputs
    out = _out(n).dtype
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


@_reg("logical_not")
def _lnot(ex: Exporter, n: Node) -> Any:
    return ex.op("Not", [ex.val(n.inputs[0], DType.bool)])


@_reg("bitwise_not")
def _bnot(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    return ex.op("Not" if dt == DType.bool else "BitwiseNot", [ex.val(n.inputs[0], dt)])


@_reg("where")
def _where(ex: Exporter, n: Node) -> Any:
    c, a, b = n.inputs
    dt = _out(n).dtype
    return ex.op("Where", [ex.val(c, DType.bool), ex.val(a, dt), ex.val(b, dt)])


@_reg("clamp")
def _clamp(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    lo, hi = _a(n, "min"), _a(n, "max")
    args = [ex.val(n.inputs[0], dt)]
    args.append("" if lo is None else ex.const(lo, dt))
    args.append("" if hi is None else ex.const(hi, dt))
    while args[-1] == "":
        args.pop()
    return ex.op("Clip", args)


@_reg("cast")
def _cast(ex: Exporter, n: Node) -> Any:
    return ex.op("Identity", [ex.val(n.inputs[0], _out(n).dtype)])


@_reg("const")
def _const(ex: Exporter, n: Node) -> Any:
    value = _a(n, "value")
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


# -- reductions ----------------------------------------------------------------------------
_REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "prod": "ReduceProd",
    "amax": "ReduceMax",
    "amin": "ReduceMin",
    "logsumexp": "ReduceLogSumExp",
}


@_reg(*_REDUCE, "all", "any")
def _reduce(ex: Exporter, n: Node) -> Any:
    dims = tuple(_a(n, "dims") or ())
    keep = int(bool(_a(n, "keepdim")))
    out = _out(n).dtype
    x = n.inputs[0]
    if not dims:
        return ex.op("Identity", [ex.val(x, out)])
    if n.op in ("all", "any"):
        xi = ex.cast(ex.val(x, DType.bool), DType.bool, DType.i32)
        r = ex.op("ReduceMin" if n.op == "all" else "ReduceMax", [xi, ex.ints(dims)], keepdims=keep)
        return ex.cast(r, DType.i32, out)
    return ex.op(_REDUCE[n.op], [ex.val(x, out), ex.ints(dims)], keepdims=keep)


@_reg("max", "min")
def _max_dim(ex: Exporter, n: Node) -> Any:
    x = ex.val(n.inputs[0])
    dim, keep = int(_a(n, "dim")), int(bool(_a(n, "keepdim")))
    red = ex.op("ReduceMax" if n.op == "max" else "ReduceMin", [x, ex.ints([dim])], keepdims=keep)
    idx = ex.op("ArgMax" if n.op == "max" else "ArgMin", [x], axis=dim, keepdims=keep)
    return [red, idx]


@_reg("argmax", "argmin")
def _argmax(ex: Exporter, n: Node) -> Any:
    x = ex.val(n.inputs[0])
    dim, keep = _a(n, "dim"), int(bool(_a(n, "keepdim")))
    op_type = "ArgMax" if n.op == "argmax" else "ArgMin"
    if dim is None:
        flat = ex.op("Reshape", [x, ex.ints([-1])])
        r = ex.op(op_type, [flat], axis=0, keepdims=0)
        if keep:
            r = ex.op("Reshape", [r, ex.ints([1] * _tt(n.inputs[0]).rank)])
        return r
    return ex.op(op_type, [x], axis=int(dim), keepdims=keep)


@_reg("cumsum")
def _cumsum(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    return ex.op("CumSum", [ex.val(n.inputs[0], dt), ex.const(int(_a(n, "dim")), DType.i64)])


@_reg("softmax", "log_softmax")
def _softmax(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    return ex.op(
        "Softmax" if n.op == "softmax" else "LogSoftmax",
        [ex.val(n.inputs[0], dt)],
        axis=int(_a(n, "dim")),
    )


# -- shapes ----------------------------------------------------------------------------
@_reg("reshape")
def _reshape(ex: Exporter, n: Node) -> Any:
    return ex.op("Reshape", [ex.val(n.inputs[0]), ex.dims(_a(n, "shape"))])


@_reg("permute")
def _permute(ex: Exporter, n: Node) -> Any:
    return ex.op("Transpose", [ex.val(n.inputs[0])], perm=list(_a(n, "perm")))


@_reg("unsqueeze")
def _unsqueeze(ex: Exporter, n: Node) -> Any:
    return ex.op("Unsqueeze", [ex.val(n.inputs[0]), ex.ints([int(_a(n, "dim"))])])


@_reg("squeeze")
def _squeeze(ex: Exporter, n: Node) -> Any:
    dims = list(_a(n, "dims") or ())
    if not dims:
        return ex.op("Identity", [ex.val(n.inputs[0])])
    return ex.op("Squeeze", [ex.val(n.inputs[0]), ex.ints(dims)])


@_reg("expand")
def _expand(ex: Exporter, n: Node) -> Any:
    shape = [1 if isinstance(d, int) and d == -1 else d for d in _a(n, "shape")]
    return ex.op("Expand", [ex.val(n.inputs[0]), ex.dims(shape)])


@_reg("repeat")
def _repeat(ex: Exporter, n: Node) -> Any:
    reps = list(_a(n, "repeats"))
    x = ex.val(n.inputs[0])
    extra = len(reps) - _tt(n.inputs[0]).rank
    if extra > 0:
        x = ex.op("Unsqueeze", [x, ex.ints(list(range(extra)))])
    return ex.op("Tile", [x, ex.dims(reps)])


@_reg("flip")
def _flip(ex: Exporter, n: Node) -> Any:
    dims = list(_a(n, "dims"))
    k = len(dims)
    return ex.op(
        "Slice",
        [ex.val(n.inputs[0]), ex.ints([-1] * k), ex.ints([INT64_MIN] * k), ex.ints(dims), ex.ints([-1] * k)],
    )


@_reg("slice")
def _slice(ex: Exporter, n: Node) -> Any:
    start, end, step = _a(n, "start"), _a(n, "end"), int(_a(n, "step") or 1)
    dim = int(_a(n, "dim"))
    s = ex.expr(0 if start is None else start)
    e = ex.expr(INT64_MAX if end is None else end)
    return ex.op("Slice", [ex.val(n.inputs[0]), s, e, ex.ints([dim]), ex.ints([step])])


@_reg("select")
def _select(ex: Exporter, n: Node) -> Any:
    index = _a(n, "index")
    idx = ex.const(int(index), DType.i64) if isinstance(index, int) else ex.scalar_expr(index)
    return ex.op("Gather", [ex.val(n.inputs[0]), idx], axis=int(_a(n, "dim")))


@_reg("cat")
def _cat(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    return ex.op("Concat", [ex.val(v, dt) for v in n.inputs], axis=int(_a(n, "dim")))


@_reg("split")
def _split(ex: Exporter, n: Node) -> Any:
    sizes = list(_a(n, "sizes"))
    outs = ex.op("Split", [ex.val(n.inputs[0]), ex.dims(sizes)], n_out=len(sizes), axis=int(_a(n, "dim")))
    return [outs] if len(sizes) == 1 else outs


@_reg("embedding")
def _embedding(ex: Exporter, n: Node) -> Any:
    return ex.op("Gather", [ex.val(n.inputs[1]), ex.val(n.inputs[0])], axis=0)


@_reg("tril", "triu")
def _tri(ex: Exporter, n: Node) -> Any:
    k = _a(n, "diagonal")
    kk = ex.const(int(k), DType.i64) if isinstance(k, int) else ex.scalar_expr(k)
    return ex.op("Trilu", [ex.val(n.inputs[0]), kk], upper=int(n.op == "triu"))


@_reg("pad")
def _pad(ex: Exporter, n: Node) -> Any:
    pad = list(_a(n, "pad"))
    rank = _tt(n.inputs[0]).rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[
        str(_a(n, "mode"))
    ]
    dt = _out(n).dtype
    args = [ex.val(n.inputs[0]), ex.dims(begins + ends)]
    if mode == "constant":
        value = _a(n, "value")
        args.append(ex.const(0 if value is None else value, dt))
    if mode == "wrap" and ex.opset < 19:
        raise ExportError("circular padding needs opset 19")
    return ex.op("Pad", args, mode=mode)


@_reg("full")
def _full(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    value = _a(n, "value")
    shape = ex.dims(_a(n, "shape"))
    if isinstance(value, sympy.Basic) and value.free_symbols:
        return ex.op("Expand", [ex.scalar_expr(value, dt), shape])
    tensor = ex.onnx.helper.make_tensor("value", onnx_dtype(dt), [1], [_py(value, dt)])
    return ex.op("ConstantOfShape", [shape], value=tensor)


def _py(value: Any, dt: DType) -> Any:
    if dt == DType.bool:
        return bool(value)
    if dt.is_integer:
        return int(value)
    return float(value)


@_reg("arange")
def _arange(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    parts = []
    for k in ("start", "end", "step"):
        v = _a(n, k)
        if isinstance(v, sympy.Basic) and v.free_symbols:
            parts.append(ex.scalar_expr(v, dt))
        else:
            parts.append(ex.const(_py(v, dt), dt))
    return ex.op("Range", parts)


# -- linear algebra, nn --------------------------------------------------------------------
@_reg("matmul")
def _matmul(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    return ex.op("MatMul", [ex.val(n.inputs[0], dt), ex.val(n.inputs[1], dt)])


@_reg("linear")
def _linear(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    x, w = ex.val(n.inputs[0], dt), ex.val(n.inputs[1], dt)
    wt = ex.op("Transpose", [w], perm=[1, 0]) if _tt(n.inputs[1]).rank == 2 else w
    y = ex.op("MatMul", [x, wt])
    if _a(n, "has_bias"):
        y = ex.op("Add", [y, ex.val(n.inputs[2], dt)])
    return y


def _ints(v: Any, k: int) -> list[int]:
    if isinstance(v, int):
        return [v] * k
    return [int(x) for x in v]


@_reg("conv", "conv_transpose")
def _conv(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    wt = _tt(n.inputs[1])
    k = wt.rank - 2
    ksize = list(wt.shape[2:])
    static = all(isinstance(d, int) for d in ksize)
    stride = _ints(_a(n, "stride"), k)
    dilation = _ints(_a(n, "dilation"), k)
    padding: Any = _a(n, "padding")
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
        "group": int(_a(n, "groups")),
        "kernel_shape": ksize if static else None,
    }
    if n.op == "conv_transpose":
        attrs["output_padding"] = _ints(_a(n, "output_padding"), k)
        return ex.op("ConvTranspose", args, **attrs)
    return ex.op("Conv", args, **attrs)


@_reg("max_pool", "avg_pool")
def _pool(ex: Exporter, n: Node) -> Any:
    ks = [int(x) for x in _a(n, "kernel_size")]
    k = len(ks)
    stride = _ints(_a(n, "stride") or ks, k)
    attrs: dict[str, Any] = {
        "kernel_shape": ks,
        "strides": stride,
        "pads": _ints(_a(n, "padding"), k) * 2,
        "ceil_mode": int(bool(_a(n, "ceil_mode"))),
    }
    x = ex.val(n.inputs[0])
    if n.op == "max_pool":
        attrs["dilations"] = _ints(_a(n, "dilation"), k)
        return ex.op("MaxPool", [x], **attrs)
    if _a(n, "divisor_override") is not None:
        raise ExportError("avg_pool with divisor_override")
    attrs["count_include_pad"] = int(bool(_a(n, "count_include_pad")))
    return ex.op("AveragePool", [x], **attrs)


@_reg("adaptive_avg_pool", "adaptive_max_pool")
def _adaptive(ex: Exporter, n: Node) -> Any:
    out = list(_a(n, "output_size"))
    x = ex.val(n.inputs[0])
    t = _tt(n.inputs[0])
    avg = n.op == "adaptive_avg_pool"
    if all(o == 1 for o in out):
        return ex.op("GlobalAveragePool" if avg else "GlobalMaxPool", [x])
    spatial = t.shape[2:]
    if all(isinstance(s, int) and isinstance(o, int) and s % o == 0 for s, o in zip(spatial, out)):
        ks = [int(s) // int(o) for s, o in zip(spatial, out)]
        return ex.op("AveragePool" if avg else "MaxPool", [x], kernel_shape=ks, strides=ks)
    raise ExportError("adaptive pooling to a size that does not divide the (static) input size")


@_reg("layer_norm")
def _layer_norm(ex: Exporter, n: Node) -> Any:
    dt = _out(n).dtype
    ns = list(_a(n, "normalized_shape"))
    args = [ex.val(v, dt) for v in n.inputs]
    x, rest = args[0], args[1:]
    w = rest.pop(0) if _a(n, "has_weight") else None
    b = rest.pop(0) if _a(n, "has_bias") else None
    if w is None:
        w = ex.op(
            "ConstantOfShape",
            [ex.dims(ns)],
            value=ex.onnx.helper.make_tensor("value", onnx_dtype(dt), [1], [1.0]),
        )
    ins = [x, w] + ([b] if b is not None else [])
    return ex.op("LayerNormalization", ins, axis=-len(ns), epsilon=float(_a(n, "eps")))


@_reg("interpolate")
def _interpolate(ex: Exporter, n: Node) -> Any:
    if _a(n, "antialias"):
        raise ExportError("interpolate with antialias=True")
    mode = str(_a(n, "mode"))
    align = bool(_a(n, "align_corners"))
    x = ex.val(n.inputs[0])
    t = _tt(n.inputs[0])
    out = _out(n)
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
    sf = _a(n, "scale_factor")
    if sf is not None and not _a(n, "recompute_scale_factor"):
        k = t.rank - 2
        scales = [1.0, 1.0] + ([float(sf)] * k if not isinstance(sf, tuple) else [float(s) for s in sf])
        return ex.op("Resize", [x, "", ex.const(scales, DType.f32, [len(scales)])], **attrs)
    return ex.op("Resize", [x, "", "", ex.dims(out.shape)], **attrs)


@_reg("sdpa")
def _sdpa(ex: Exporter, n: Node) -> Any:
    if _a(n, "enable_gqa"):
        raise ExportError("sdpa with enable_gqa=True")
    dt = _out(n).dtype
    q, k, v = (ex.val(x, dt) for x in n.inputs[:3])
    qt = _tt(n.inputs[0])
    rank = qt.rank
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scale = _a(n, "scale")
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
    if _a(n, "is_causal"):
        shp = ex.op("Shape", [s], start=-2)
        ones = ex.op(
            "ConstantOfShape",
            [shp],
            value=ex.onnx.helper.make_tensor("value", ex.onnx.TensorProto.BOOL, [1], [True]),
        )
        s = ex.op("Where", [ex.op("Trilu", [ones], upper=0), s, ninf])
    if _a(n, "has_mask"):
        mask = n.inputs[3]
        if dtype_of(mask.type) == DType.bool:
            s = ex.op("Where", [ex.val(mask), s, ninf])
        else:
            s = ex.op("Add", [s, ex.val(mask, dt)])
    return ex.op("MatMul", [ex.op("Softmax", [s], axis=-1), v])


# -- control flow ------------------------------------------------------------------------
def _pred(ex: Exporter, v: Value) -> str:
    return ex.op("Reshape", [ex.val(v, DType.bool), ex.ints([])])


def _yield(ex: Exporter, block: Block) -> list[tuple[str, Type]]:
    return [(ex.env[r], r.type) for r in block.results]


@_reg("if")
def _if(ex: Exporter, n: Node) -> Any:
    cond = _pred(ex, n.inputs[0])
    then_b, else_b = n.regions

    def branch(b: Block) -> Callable[[], list[tuple[str, Type]]]:
        def body() -> list[tuple[str, Type]]:
            ex.block(b.nodes)
            return _yield(ex, b)

        return body

    g1 = ex.subgraph(ex.fresh("then"), [], branch(then_b))
    g2 = ex.subgraph(ex.fresh("else"), [], branch(else_b))
    return ex.op("If", [cond], n_out=len(n.outputs), then_branch=g1, else_branch=g2)


@_reg("for")
def _for(ex: Exporter, n: Node) -> Any:
    start, stop, step, *init = n.inputs
    (body_b,) = n.regions
    s0 = ex.val(start, DType.i64)
    s1 = ex.val(stop, DType.i64)
    st = ex.val(step, DType.i64)
    f64 = DType.f64
    span = ex.cast(ex.op("Sub", [s1, s0]), DType.i64, f64)
    trips = ex.op("Ceil", [ex.op("Div", [span, ex.cast(st, DType.i64, f64)])])
    trips = ex.op("Max", [ex.cast(trips, f64, DType.i64), ex.const(0, DType.i64)])
    var = sympy.Symbol(str(_a(n, "var")), integer=True, nonnegative=True)
    it, cond_in = ex.fresh("iter"), ex.fresh("cond")
    args = [ex.fresh("carry") for _ in body_b.args]

    def body() -> list[tuple[str, Type]]:
        idx = ex.op("Add", [s0, ex.op("Mul", [it, st])])
        ex.scope.syms[var] = ex.op("Reshape", [idx, ex.ints([1])])
        for a, name in zip(body_b.args, args):
            ex.env[a] = name
        ex.block(body_b.nodes)
        return [(cond_in, ScalarType(ScalarKind.bool)), *_yield(ex, body_b)]

    ins: list[tuple[str, Type]] = [(it, ScalarType(ScalarKind.int)), (cond_in, ScalarType(ScalarKind.bool))]
    ins += [(name, a.type) for a, name in zip(body_b.args, args)]
    g = ex.subgraph(ex.fresh("for_body"), ins, body)
    outs = ex.op("Loop", [trips, "", *(ex.val(v) for v in init)], n_out=len(n.outputs), body=g)
    return [outs] if len(n.outputs) == 1 else outs


@_reg("while")
def _while(ex: Exporter, n: Node) -> Any:
    cond_b, body_b = n.regions

    def run_cond(values: Sequence[str]) -> str:
        for a, name in zip(cond_b.args, values):
            ex.env[a] = name
        ex.block(cond_b.nodes)
        return _pred(ex, cond_b.results[0])

    first = run_cond([ex.val(v) for v in n.inputs])
    it, cond_in = ex.fresh("iter"), ex.fresh("cond")
    args = [ex.fresh("carry") for _ in body_b.args]

    def body() -> list[tuple[str, Type]]:
        for a, name in zip(body_b.args, args):
            ex.env[a] = name
        ex.block(body_b.nodes)
        nxt = [ex.env[r] for r in body_b.results]
        c = run_cond(nxt)
        return [(c, ScalarType(ScalarKind.bool)), *_yield(ex, body_b)]

    ins: list[tuple[str, Type]] = [(it, ScalarType(ScalarKind.int)), (cond_in, ScalarType(ScalarKind.bool))]
    ins += [(name, a.type) for a, name in zip(body_b.args, args)]
    g = ex.subgraph(ex.fresh("while_body"), ins, body)
    outs = ex.op("Loop", ["", first, *(ex.val(v) for v in n.inputs)], n_out=len(n.outputs), body=g)
    return [outs] if len(n.outputs) == 1 else outs
