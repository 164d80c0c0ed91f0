"""Rules of the ops that make values from attributes alone: scalar constants,
``full`` and ``arange``."""

from __future__ import annotations

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarType, TensorType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import (
    call,
    cast,
    const,
    opmath,
    out_type,
)
from cuvil_ir.tensor_ir.rules.table import rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, idx


# -- factories and constants ----------------------------------------------------------
@rule("const")
def _const(lw: LoweringContext, n: Node) -> E.Expr:
    v = n.attr("value")
    t = n.outputs[0].type
    if isinstance(t, TensorType):
        raise NotLowered("tensor constant")
    assert isinstance(t, ScalarType)
    dtype = SCALAR_DTYPES[t.kind]
    if isinstance(v, sympy.Basic):
        if not v.is_number:
            if isinstance(v, (sympy.Rel, sympy.logic.boolalg.Boolean)) and not isinstance(v, sympy.Symbol):
                raise NotLowered("size predicate")
            return E.Index(v, dtype)
        v = bool(v) if dtype == DType.bool else (float(v) if dtype.is_floating else int(v))
    if not isinstance(v, (bool, int, float)):
        raise NotLowered(f"constant {v!r}")
    return const(v, dtype)


@rule("full")
def _full(lw: LoweringContext, n: Node) -> Lazy:
    t = out_type(n)
    v = n.attr("value")
    if not isinstance(v, (bool, int, float)):
        raise NotLowered("symbolic fill value")
    return Lazy(t.shape, t.dtype, const(v, t.dtype))


@rule("arange")
def _arange(lw: LoweringContext, n: Node) -> Lazy:
    t = out_type(n)
    start, step = n.attr("start"), n.attr("step")
    if not all(isinstance(v, (int, float, sympy.Basic)) for v in (start, step)):
        raise NotLowered("arange bounds")
    if t.dtype.is_floating and (isinstance(start, float) or isinstance(step, float)):
        # eager's accumulate type on CPU: float64 for float32 and float64, float32 for halves
        acc = DType.f32 if opmath(t.dtype) != t.dtype else DType.f64
        body: E.Expr = call(
            "add",
            const(float(start), acc),  # type: ignore[arg-type]
            call("mul", cast(E.Index(idx(1)[0], DType.i64), acc), const(float(step), acc)),  # type: ignore[arg-type]
        )
        return Lazy(t.shape, t.dtype, cast(body, t.dtype))
    if isinstance(start, float) or isinstance(step, float):
        raise NotLowered("float arange into an integer tensor")
    return Lazy(t.shape, t.dtype, cast(E.Index(sympy.sympify(start) + idx(1)[0] * step, DType.i64), t.dtype))
