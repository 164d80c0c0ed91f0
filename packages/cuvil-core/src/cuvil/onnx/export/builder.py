"""The ONNX graph being built: scopes (the top level and nested subgraphs), fresh value
and node names, nodes, constants and casts.

:class:`GraphBuilder` knows nothing of Graph IR; :class:`~cuvil.onnx.export.sizes.SizeExprs`
adds size expressions on top of it and :class:`~cuvil.onnx.export.exporter.Exporter`
the Graph IR walk. Names are numbered in program order, so the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.types import DType, element_dtype

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


class Scope:
    """One ONNX graph being built: the top level or a subgraph (branch, loop body)."""

    def __init__(self, parent: Scope | None) -> None:
        self.parent = parent
        self.nodes: list[Any] = []
        self.cache: dict[Any, str] = {}
        self.syms: dict[sympy.Symbol, str] = {}

    def lookup(self, key: Any) -> str | None:
        s: Scope | None = self
        while s is not None:
            if key in s.cache:
                return s.cache[key]
            s = s.parent
        return None

    def sym(self, s: sympy.Symbol) -> str | None:
        sc: Scope | None = self
        while sc is not None:
            if s in sc.syms:
                return sc.syms[s]
            sc = sc.parent
        return None


class GraphBuilder:
    """ONNX nodes appended to the current scope (``scope``; ``top`` is the model's graph)."""

    def __init__(self, opset: int = OPSET) -> None:
        self.onnx = _onnx()
        self.opset = opset
        self.counter = 0
        self.node_counter = 0
        self.scope = Scope(None)
        self.top = self.scope

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


__all__ = ["INT64_MAX", "INT64_MIN", "OPSET", "ExportError", "GraphBuilder", "dtype_of", "onnx_dtype"]
