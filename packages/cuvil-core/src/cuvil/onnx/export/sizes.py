"""Size expressions (sympy) as ONNX integer arithmetic.

Size symbols are read once from the graph inputs (``Shape(x, start=i, end=i+1)``, in a
prologue at the top of the model, only for symbols something needs); expressions over
them (reshape targets, slice bounds, ``const`` values, trip counts) are computed with
int64 ONNX nodes, shape ``[1]``, cached per scope. Non-integer expressions
(``x_2**(-0.5)``) are computed in double precision by the visitor's float walk (see [Note:
float size semantics]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil.onnx.export.builder import OPSET, ExportError, GraphBuilder, Scope
from cuvil_ir.graph_ir.types import DType, ScalarKind
from cuvil_ir.size_visitor import Quotient, SizeVisitor, integer_valued
from cuvil_ir.symbolic import expr_str


class SizeExprs(GraphBuilder, SizeVisitor[str]):
    """A :class:`GraphBuilder` that writes size expressions (:meth:`expr`, :meth:`dims`): the
    :class:`~cuvil_ir.size_visitor.SizeVisitor` for ONNX int64 nodes (see [Note: size
    division semantics] and [Note: floor division in ONNX])."""

    language = "ONNX"

    def size_error(self, message: str) -> Exception:
        return ExportError(message)

    def __init__(self, opset: int = OPSET) -> None:
        super().__init__(opset)
        #: the Shape nodes that read size symbols, placed first in the top-level graph
        self.prologue = Scope(None)
        #: symbol -> (graph input name, axis) it is read from
        self.sources: dict[sympy.Symbol, tuple[str, int]] = {}
        #: expression outputs computed in double precision (non-integer size expressions)
        self.floats: set[str] = set()

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
            return self.on_symbol(e, None)
        if not integer_valued(e) and not _is_bool(e):
            out = self.visit_float(e)
            self.floats.add(out)
            return out
        return self.decompose_size(e, None)

    # -- the visitor's hooks (int64, or bool for predicates) -------------------------
    def visit_size(self, e: Any, ctx: Any = None) -> str:
        return self.expr(e)

    def order_operands(self, args: Sequence[Any]) -> list[Any]:
        return list(args)  # sympy's own order

    def fold_size(self, op: str, args: Sequence[Any], ctx: Any) -> str:
        parts = [self.expr(a) for a in args]
        if op in ("min", "max"):
            out = self.op("Min" if op == "min" else "Max", parts)
            # already of shape [1]; the Reshape keeps it so for load.py, whose Max/Min fold
            # of one-element known values gives a 0-d value
            return self.op("Reshape", [out, self.ints([1])])
        out = parts[0]
        for p in parts[1:]:
            out = self.op(_BINARY[op], [out, p])
        return out

    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
        name = self.scope.sym(s)
        if name is None:
            src = self.sources.get(s)
            if src is None:
                raise ExportError(f"size symbol {s} is not bound by a graph input or loop")
            # read once, in the prologue of the top-level graph (visible everywhere)
            scope, self.scope = self.scope, self.prologue
            try:
                name = self.op("Shape", [src[0]], start=src[1], end=src[1] + 1)
            finally:
                self.scope = scope
            self.top.syms[s] = name
        return name

    def on_integer(self, value: int) -> str:
        return self.const([value], DType.i64, [1])

    def on_boolean(self, value: bool) -> str:
        return self.const([value], DType.bool, [1])

    def on_exactdiv(self, a: str, b: str, q: Quotient) -> str:
        return self.op("Div", [a, b])

    def on_floordiv(self, a: str, b: str, q: Quotient) -> str:
        return self._rounded_div(a, b, q, up=False)

    def on_ceildiv(self, a: str, b: str, q: Quotient) -> str:
        return self._rounded_div(a, b, q, up=True)

    def on_mod(self, a: str, b: str, q: Quotient) -> str:
        return self.op("Mod", [a, b])  # fmod=0: the divisor's sign, as Python's %

    def on_compare(self, op: str, a: str, b: str) -> str:
        if op == "!=":
            return self.op("Not", [self.op("Equal", [a, b])])
        return self.op(_COMPARE[op], [a, b])

    def on_and(self, a: str, b: str) -> str:
        return self.op("And", [a, b])

    def on_or(self, a: str, b: str) -> str:
        return self.op("Or", [a, b])

    def on_not(self, a: str) -> str:
        return self.op("Not", [a])

    def on_select(self, cond: str, then: str, other: str) -> str:
        return self.op("Where", [cond, then, other])

    def on_unsupported(self, e: Any, ctx: Any) -> str:
        raise ExportError(f"size expression {expr_str(e)} has no ONNX translation")

    def _rounded_div(self, a: str, b: str, q: Quotient, *, up: bool) -> str:
        """``floor(num / den)`` (``ceiling`` when ``up``), as Python's ``//`` means it.

        [Note: floor division in ONNX] ONNX's integer ``Div`` truncates toward zero, which
        is the floor only when the quotient cannot be negative: ``Div`` is used when sympy
        knows both operands are >= 0; otherwise the quotient is computed in double
        precision and rounded (``Floor``/``Ceil``), exact while ``|num| < 2**53`` (sizes).
        ``Mod`` needs nothing: ONNX's integer ``Mod`` takes the divisor's sign, as ``%``.
        The importer folds both forms back into the same ``floor``/``ceiling``.
        """
        if q.nonnegative:
            n = a if not up else self.op("Add", [a, self.expr(q.den - 1)])
            return self.op("Div", [n, b])
        f64 = DType.f64
        quot = self.op("Div", [self._as_f64(a), self._as_f64(b)])
        return self.cast(self.op("Ceil" if up else "Floor", [quot]), f64, DType.i64)

    def _as_f64(self, name: str) -> str:
        return name if name in self.floats else self.cast(name, DType.i64, DType.f64)

    # -- the float walk's hooks (double; see [Note: float size semantics]) -------------
    def fold_float(self, op: str, args: Sequence[Any], ctx: Any) -> str:
        parts = [self.visit_float(a, ctx) for a in args]  # every operand first, as fold_size
        hook = self.on_fadd if op == "add" else self.on_fmul
        out = parts[0]
        for p in parts[1:]:
            out = hook(out, p)
        return out

    def on_fadd(self, a: str, b: str) -> str:
        return self.op("Add", [a, b])

    def on_fmul(self, a: str, b: str) -> str:
        return self.op("Mul", [a, b])

    def on_float(self, value: float) -> str:
        return self.const([value], DType.f64, [1])

    def on_to_float(self, a: str) -> str:
        return self._as_f64(a)

    def on_fpow(self, base: str, exp: str) -> str:
        return self.op("Pow", [base, exp])

    def on_unsupported_float(self, e: Any, ctx: Any) -> str:
        raise ExportError(f"float size expression {expr_str(e)} has no ONNX translation")

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


_BINARY = {"add": "Add", "mul": "Mul", "and": "And", "or": "Or"}
_COMPARE = {"<": "Less", "<=": "LessOrEqual", ">": "Greater", ">=": "GreaterOrEqual", "==": "Equal"}


def _is_bool(e: Any) -> bool:
    if isinstance(e, bool):
        return True
    return isinstance(e, sympy.Basic) and ScalarKind.of(e) == ScalarKind.bool


__all__ = ["SizeExprs"]
