"""The importer: :class:`Importer` walks an ONNX graph and translates each node through the
handler registered for its op type in :data:`OPS` (filled by the ``ops_*`` modules and
:mod:`.control_flow`) into registered Graph IR ops.

Output types come from each op's own shape rule, under a :class:`ShapeContext` with the
call's sizes as hints, so the size facts the graph relies on become its assumptions,
exactly as in tracing. An op type without a handler is an :class:`OnnxImportError` naming
the op type and the node. Values whose contents are known when importing are
:class:`~cuvil.onnx.import_.folding.Known` (constant folding); initializers used as
tensors become graph inputs that the callable passes on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import sympy
import torch

from cuvil.onnx.export.builder import onnx_dtype
from cuvil.onnx.export.exporter import python_value
from cuvil.onnx.import_.folding import Known, to_dim
from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types, registrar
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext, symbol


class OnnxImportError(NotImplementedError):
    """An ONNX node this importer cannot translate (names the op type and node)."""


_ONNX_TO_DTYPE: dict[int, DType] = {}


def to_dtype(elem_type: int) -> DType:
    if not _ONNX_TO_DTYPE:
        for dt in DType:
            _ONNX_TO_DTYPE[onnx_dtype(dt)] = dt
    try:
        return _ONNX_TO_DTYPE[elem_type]
    except KeyError:
        raise OnnxImportError(f"ONNX element type {elem_type} is not supported") from None


def identifier(name: str, fallback: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if not out or out[0].isdigit():
        out = f"{fallback}_{out}"
    return out


def size_symbol(name: str) -> sympy.Symbol:
    try:
        return symbol(name)
    except ValueError:
        return symbol(f"s_{name}")


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
            v = Value(identifier(name, "in"), t)
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
        flat = [to_dim(x) for x in np.asarray(arr, dtype=object).reshape(-1).tolist()]
        shape = tuple(int(s) for s in arr.shape)
        symbolic = any(isinstance(x, sympy.Basic) for x in flat)
        if len(flat) == 1:
            value = flat[0]
            if not symbolic:
                value = python_value(value, k.dtype)
            return self.emit("full", [], shape=shape, value=value, dtype=k.dtype, device=self.device)  # type: ignore[no-any-return]
        if symbolic:
            parts = [
                self.emit("full", [], shape=(1,), value=x, dtype=k.dtype, device=self.device) for x in flat
            ]
            out = self.emit("cat", parts, dim=0)
            return self.emit("reshape", [out], shape=shape)  # type: ignore[no-any-return]
        t = torch.tensor(
            np.asarray(arr).astype(_numpy_dtype(k.dtype)), dtype=k.dtype.torch, device=self.device
        )
        v = Value(identifier(f"const_{name}", "c"), TensorType(k.dtype, shape, self.device))
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
            identifier(g.name or "onnx", "g"),
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


def _numpy_dtype(dt: DType) -> Any:
    return torch.empty((), dtype=dt.torch).numpy().dtype if dt != DType.bf16 else np.float32


def _attr(a: Any) -> Any:
    from onnx import helper

    return helper.get_attribute_value(a)


def attribute_text(v: Any) -> Any:
    """A string attribute as ``str`` (ONNX stores them as bytes)."""
    return v.decode() if isinstance(v, bytes) else v


# -- the op table ------------------------------------------------------------------------
Handler = Callable[[Importer, Any, list[str], dict[str, Any]], Any]
OPS: dict[str, Handler] = {}


#: ``@register("Add", "Sub")`` puts a handler in :data:`OPS`
register = registrar(OPS)


def inverse(table: Mapping[str, str], *, unless: Collection[str] = ()) -> dict[str, str]:
    """ONNX op -> Cuvil op: an export table (Cuvil op -> ONNX op) read backwards, less the
    ONNX ops in ``unless`` (imported by a handler of their own). See [Note: one-to-one
    ONNX tables] in :mod:`cuvil.onnx.export.elementwise`."""
    out: dict[str, str] = {}
    for op, onnx_op in table.items():
        if onnx_op in unless:
            continue
        if onnx_op in out:
            raise ValueError(f"ONNX {onnx_op} is written for both {out[onnx_op]} and {op}: not one to one")
        out[onnx_op] = op
    return out


def rank(v: Value) -> int:
    t = v.type
    return t.rank if isinstance(t, TensorType) else 0


def norm_axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def dtype_of(v: Value) -> DType:
    t = v.type
    assert isinstance(t, TensorType)
    return t.dtype


__all__ = [
    "OPS",
    "Handler",
    "Importer",
    "OnnxImportError",
    "attribute_text",
    "dtype_of",
    "identifier",
    "inverse",
    "norm_axis",
    "rank",
    "register",
    "size_symbol",
    "to_dtype",
]
