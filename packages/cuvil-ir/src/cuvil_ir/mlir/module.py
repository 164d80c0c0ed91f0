"""The MLIR emitter's ground floor: element and tensor types, literals, the text
being built (fresh SSA names, scopes of values already emitted, indentation),
constants, and the helpers every op family uses (attributes, :class:`Unsupported`).

The emitter is one class built in layers, one module each, in the order they depend
on each other: :mod:`~cuvil_ir.mlir.module` (this one), :mod:`~cuvil_ir.mlir.sizes`,
:mod:`~cuvil_ir.mlir.tensors`, :mod:`~cuvil_ir.mlir.elementwise`,
:mod:`~cuvil_ir.mlir.reductions`, :mod:`~cuvil_ir.mlir.shapes`,
:mod:`~cuvil_ir.mlir.linalg`, and the driver, :mod:`~cuvil_ir.mlir.emit` (dispatch,
decompositions and fallback decompositions, control flow, the function).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, Graph, Node, Ref
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarType, Type, element_dtype
from cuvil_ir.symbolic import Dim, dim_str, expr_str


class MlirError(Exception):
    """A graph (or one of its nodes) that cannot be emitted as MLIR."""


_ELEM = {
    DType.bool: "i1",
    DType.u8: "i8",
    DType.i8: "i8",
    DType.i16: "i16",
    DType.i32: "i32",
    DType.i64: "i64",
    DType.f16: "f16",
    DType.bf16: "bf16",
    DType.f32: "f32",
    DType.f64: "f64",
}
BITS = {DType.u8: 8, DType.i8: 8, DType.i16: 16, DType.i32: 32, DType.i64: 64, DType.f16: 16}
BITS.update({DType.bf16: 16, DType.f32: 32, DType.f64: 64})

# An operand: (SSA name, Graph IR type)
H = tuple[str, Type]


def elem(d: DType) -> str:
    if d not in _ELEM:
        raise MlirError(f"dtype {d.value} has no MLIR element type here")
    return _ELEM[d]


dtype_of = element_dtype


def mlir_type(t: Type) -> str:
    if isinstance(t, ScalarType):
        return elem(SCALAR_DTYPES[t.kind])
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in t.shape)
    return f"tensor<{dims}{elem(t.dtype)}>"


def float_lit(v: float, d: DType) -> str:
    if math.isfinite(v):
        return f"{v:.17e}"
    if d == DType.f64:
        return "0x" + struct.pack(">d", v).hex().upper()
    if d == DType.f32:
        return "0x" + struct.pack(">f", v).hex().upper()
    if d == DType.f16:
        return "0x" + struct.pack(">e", v).hex().upper()
    if d == DType.bf16:
        return "0x" + struct.pack(">f", v).hex().upper()[:4]
    raise MlirError(f"no float literal for {d}")


class ModuleBuilder:
    """The module text being built, its SSA names and scopes, and constants."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.counter = 0
        self.lines: list[str] = []
        self.indent = 2
        self.scopes: list[dict[object, str]] = [{}]
        self.values: dict[str, H] = {}
        self.externs: dict[str, str] = {}
        self.extern_decls: dict[tuple[str, str, str], str] = {}
        self.extern_count: dict[str, int] = {}
        self.node: Node | None = None
        # sizes the graph assumes equal to a constant (``assume Eq(y_0, 1)``): broadcasting facts
        self.known: dict[sympy.Basic, sympy.Basic] = {}
        for a in graph.assumptions:
            if isinstance(a, sympy.Eq):
                for x, y in ((a.lhs, a.rhs), (a.rhs, a.lhs)):
                    if isinstance(x, sympy.Symbol) and y.is_Integer:
                        self.known[x] = y

    def is_one(self, d: Dim) -> bool:
        return d == 1 or (not isinstance(d, int) and sympy.sympify(d).xreplace(self.known) == 1)

    # -- plumbing ---------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append(" " * self.indent + line)

    def lookup(self, key: object) -> str | None:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key: Any, ssa: str) -> str:
        self.scopes[-1][key] = ssa
        return ssa

    def push(self) -> None:
        self.scopes.append({})
        self.indent += 2

    def pop(self) -> None:
        self.scopes.pop()
        self.indent -= 2

    def error(self, msg: str) -> MlirError:
        n = self.node
        where = f"{n.op}" + (f" at {n.loc}" if n is not None and n.loc is not None else "") if n else "graph"
        return MlirError(f"{self.graph.name}: {where}: {msg}")

    # -- constants ----------------------------------------------------------------------
    def const(self, value: float | int | bool, d: DType) -> str:
        key = ("const", d, repr(value), type(value))
        got = self.lookup(key)
        if got is not None:
            return got
        r = self.fresh("c")
        if d == DType.bool:
            self.emit(f"{r} = arith.constant {'true' if value else 'false'}")
        elif d.is_floating:
            self.emit(f"{r} = arith.constant {float_lit(float(value), d)} : {elem(d)}")
        else:
            self.emit(f"{r} = arith.constant {int(value)} : {elem(d)}")
        return self.remember(key, r)

    def cindex(self, v: int) -> str:
        key = ("index", v)
        got = self.lookup(key)
        if got is not None:
            return got
        r = self.fresh("c")
        self.emit(f"{r} = arith.constant {v} : index")
        return self.remember(key, r)

    def ins(self, node: Node) -> list[H]:
        return [self.values[v.name] for v in node.inputs]

    def cast_to(self, v: str, src: Type, dst: Type) -> str:
        if mlir_type(src) == mlir_type(dst):
            return v
        r = self.fresh()
        self.emit(f"{r} = tensor.cast {v} : {mlir_type(src)} to {mlir_type(dst)}")
        return r


class Unsupported(Exception):
    """Raised inside an op emitter: the node becomes an external call instead."""


def node_attr(node: Node, name: str) -> Any:
    return node.attr(name)


def as_dim(e: Any) -> Dim:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else e


def quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def attr_text(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(attr_text(x) for x in v) + "]"
    if isinstance(v, KV):
        return "{" + ", ".join(f"{k} = {attr_text(x)}" for k, x in v.items) + "}"
    if isinstance(v, Ref):
        return f"${v.index}"
    if isinstance(v, DType):
        return v.value
    if isinstance(v, sympy.Basic):
        return f"<{dim_str(v) if not v.is_Relational else expr_str(v)}>"
    if v is None:
        return "none"
    return repr(v)


__all__ = [
    "BITS",
    "H",
    "MlirError",
    "ModuleBuilder",
    "Unsupported",
    "as_dim",
    "attr_text",
    "dtype_of",
    "elem",
    "float_lit",
    "mlir_type",
    "node_attr",
    "quote",
]
