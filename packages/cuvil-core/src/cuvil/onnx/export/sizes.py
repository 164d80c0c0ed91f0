"""Size expressions (sympy) as ONNX integer arithmetic.

Size symbols are read once from the graph inputs (``Shape(x, start=i, end=i+1)``, in a
prologue at the top of the model, only for symbols something needs); expressions over
them (reshape targets, slice bounds, ``const`` values, trip counts) are computed with
int64 ONNX nodes, shape ``[1]``, cached per scope. Non-integer expressions
(``x_2**(-0.5)``) are computed in double precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil.onnx.export.builder import OPSET, ExportError, GraphBuilder, Scope
from cuvil_ir.graph_ir.types import DType, ScalarKind
from cuvil_ir.symbolic import expr_str


class SizeExprs(GraphBuilder):
    """A :class:`GraphBuilder` that writes size expressions (:meth:`expr`, :meth:`dims`)."""

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
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = e.args[0].as_numer_denom()
            return self._rounded_div(num, den, up=isinstance(e, sympy.ceiling))
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

    def _rounded_div(self, num: Any, den: Any, *, up: bool) -> str:
        """``floor(num / den)`` (``ceiling`` when ``up``), as Python's ``//`` means it.

        [Note: floor division in ONNX] ONNX's integer ``Div`` truncates toward zero, which
        is the floor only when the quotient cannot be negative: ``Div`` is used when sympy
        knows both operands are >= 0; otherwise the quotient is computed in double
        precision and rounded (``Floor``/``Ceil``), exact while ``|num| < 2**53`` (sizes).
        ``Mod`` needs nothing: ONNX's integer ``Mod`` takes the divisor's sign, as ``%``.
        The importer folds both forms back into the same ``floor``/``ceiling``.
        """
        if _nonnegative(num) and _nonnegative(den):
            n = self.expr(num) if not up else self.op("Add", [self.expr(num), self.expr(den - 1)])
            return self.op("Div", [n, self.expr(den)])
        f64 = DType.f64
        q = self.op("Div", [self._as_f64(self.expr(num)), self._as_f64(self.expr(den))])
        return self.cast(self.op("Ceil" if up else "Floor", [q]), f64, DType.i64)

    def _as_f64(self, name: str) -> str:
        return name if name in self.floats else self.cast(name, DType.i64, DType.f64)

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


def _nonnegative(e: Any) -> bool:
    return sympy.sympify(e).is_nonnegative is True


def _is_bool(e: Any) -> bool:
    if isinstance(e, bool):
        return True
    return isinstance(e, sympy.Basic) and ScalarKind.of(e) == ScalarKind.bool


__all__ = ["SizeExprs"]
