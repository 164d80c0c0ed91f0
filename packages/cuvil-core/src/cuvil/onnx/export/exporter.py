"""The Graph IR walk: :class:`Exporter` gives each Graph IR value an ONNX name and writes
each node through the op table :data:`OPS` (filled by the op-family modules of this
package), or as its decomposition when the table has no entry for it (for a primitive
without one, its fallback decomposition, :mod:`cuvil_ir.graph_ir.fallbacks`).

Handlers take ``(exporter, node)`` and return the ONNX name(s) of the node's outputs, or
``None`` for "no native form here: use the decomposition". Python scalars
(``Scalar[...]``) are 0-d tensors (int64, double, bool), cast to the operand dtype at each
use (:meth:`Exporter.val`), as torch's weak-scalar promotion does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sympy

from cuvil.onnx.export.builder import OPSET, ExportError, Scope, dtype_of, onnx_dtype
from cuvil.onnx.export.sizes import SizeExprs
from cuvil_ir.graph_ir.decompose import Decomposition, NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.fallbacks import fallback
from cuvil_ir.graph_ir.nodes import Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, registrar
from cuvil_ir.graph_ir.scalar_decompositions import scalar_decomposition
from cuvil_ir.graph_ir.types import DType, ScalarType, TensorType, Type
from cuvil_ir.symbolic import expr_str

#: writes a composite op's node itself (``(exporter, node) -> output names``), or returns
#: ``None`` to have it written as its decomposition
CustomOpWriter = Callable[["Exporter", Node], "list[str] | None"]


class Exporter(SizeExprs):
    """Graph IR nodes written as ONNX nodes; ``env`` maps each Graph IR value to its ONNX name.

    ``custom_ops`` (:class:`~cuvil.onnx.export.functions.DomainFunctions`) writes composite
    ops instead of the op table; what a writer may use of the exporter is its declared
    contract: :meth:`separate_graph`, ``env``, :meth:`block`, :meth:`op`, :meth:`val`.
    """

    def __init__(self, opset: int = OPSET, custom_ops: CustomOpWriter | None = None) -> None:
        super().__init__(opset)
        self.custom_ops = custom_ops
        self.env: dict[Value, str] = {}
        #: symbols the graph's assumptions pin to a value
        self.known: dict[sympy.Symbol, int] = {}
        #: the graph's assumptions (decompositions infer their types under them)
        self.assumptions: tuple[sympy.Basic, ...] = ()
        #: ONNX value -> the Python number of a ``const`` node it holds, so that a use in
        #: float arithmetic gets a constant of its dtype rather than a ``Cast``
        self.numbers: dict[str, float] = {}

    # -- values -----------------------------------------------------------------------
    def val(self, v: Value, dst: DType | None = None) -> str:
        name = self.env[v]
        if dst is None:
            return name
        if name in self.numbers and dst in (DType.f32, DType.f64) and dtype_of(v.type) != dst:
            return self.const(self.numbers[name], dst)
        return self.cast(name, dtype_of(v.type), dst)

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
            if self.custom_ops is not None and n.op in REGISTRY and "composite" in REGISTRY.get(n.op).traits:
                outs = self.custom_ops(self, n)  # None: its body is not closed, inline it
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
        :mod:`cuvil_ir.graph_ir.decompose`) -- for a primitive ONNX lacks, its fallback
        decomposition (:func:`onnx_fallback`) -- or an :class:`ExportError` naming the op
        and the reason its declaration gives."""
        where = f" (at {n.loc})" if n.loc else ""
        fn = None if uses_decomposition(n.op, "onnx", native=False) else onnx_fallback(n.op)
        if fn is None and not uses_decomposition(n.op, "onnx", native=False):
            extra = f" {attr(n, 'target')}" if n.op == "extern" else ""
            reason = REGISTRY.get(n.op).extern_reasons.get("onnx") if n.op in REGISTRY else None
            why = f": {reason}" if reason else ""
            raise ExportError(f"Graph IR op {n.op!r}{extra}{where} has no ONNX translation{why}")
        try:
            ex = expand(n, self.assumptions, fn)
        except NotDecomposed as e:
            raise ExportError(f"exporting {n.op}{where}: {e}") from e
        self.block(ex.nodes)
        return [self.env[v] for v in ex.outputs]

    def subgraph(
        self, name: str, inputs: Sequence[tuple[str, Type]], body: Callable[[], Sequence[tuple[str, Type]]]
    ) -> Any:
        parent = self.scope
        self.scope = Scope(parent)
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

    @contextmanager
    def separate_graph(self) -> Iterator[list[Any]]:
        """Nodes written inside go to a graph of their own (a function body): a scope with
        no parent, so no constant or size is shared with the graph around it, over a copy
        of ``env``; both are restored on exit. Yields the list the nodes are appended to."""
        outer, saved_env = self.scope, self.env
        self.scope = Scope(None)
        self.env = dict(saved_env)
        try:
            yield self.scope.nodes
        finally:
            self.scope, self.env = outer, saved_env


# -- the op table ------------------------------------------------------------------------
OpFn = Callable[[Exporter, Node], Any]
OPS: dict[str, OpFn] = {}

#: ``@register("add", "sub")`` puts a handler in :data:`OPS`
register = registrar(OPS)


def onnx_fallback(op: str) -> Decomposition | None:
    """The fallback decomposition (:mod:`cuvil_ir.graph_ir.fallbacks`, else that of the
    op's scalar function: :mod:`cuvil_ir.graph_ir.scalar_decompositions`) the exporter writes
    for the primitive ``op`` when :data:`OPS` has no entry for it (or the entry declines):
    none for an op with a decomposition of its own or one whose declaration refuses ONNX."""
    decl = REGISTRY.get(op) if op in REGISTRY else None
    if decl is None or decl.decompose is not None or "onnx" in decl.extern_reasons:
        return None
    return fallback(op) or scalar_decomposition(op)


def attr(n: Node, name: str) -> Any:
    """An attribute of ``n`` (typed loosely: each op's schema says what it holds)."""
    return n.attr(name)


def out_type(n: Node) -> TensorType:
    t = n.outputs[0].type
    assert isinstance(t, TensorType)
    return t


def tensor_of(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise ExportError(f"expected a tensor, got {t}")
    return t


def python_value(value: Any, dt: DType) -> Any:
    if dt == DType.bool:
        return bool(value)
    if dt.is_integer:
        return int(value)
    return float(value)


__all__ = [
    "OPS",
    "CustomOpWriter",
    "Exporter",
    "OpFn",
    "attr",
    "onnx_fallback",
    "out_type",
    "python_value",
    "register",
    "tensor_of",
]
