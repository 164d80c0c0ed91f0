"""Size expressions as MLIR ``index`` arithmetic: sympy sizes (``floor(x_0/2)``,
``Max``, ``Piecewise``), size predicates as ``i1`` and float-valued size expressions as
``f64``. A size symbol is bound once from an input's ``tensor.dim`` (or a loop index).
"""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.mlir.module import ModuleBuilder
from cuvil_ir.size_visitor import Quotient, SizeVisitor, quotient
from cuvil_ir.symbolic import Dim, expr_str

_PREDICATES = (sympy.Rel, sympy.And, sympy.Or, sympy.Not)
_CMPI = {"==": "eq", "!=": "ne", "<": "slt", "<=": "sle", ">": "sgt", ">=": "sge"}


class SizeEmitter(ModuleBuilder, SizeVisitor[str]):
    """Size expressions, predicates and float sizes, each emitted once per scope: the
    :class:`~cuvil_ir.size_visitor.SizeVisitor` for MLIR ``arith`` on ``index`` and ``i1``
    (see [Note: size division semantics] for floor division and modulo)."""

    language = "MLIR"

    def size_error(self, message: str) -> Exception:
        return self.error(message)

    def idx(self, e: Dim | sympy.Basic) -> str:
        """An ``index`` value for an integer size expression."""
        if isinstance(e, (int, sympy.Integer)):
            return self.cindex(int(e))
        e = sympy.sympify(e)
        key = ("idx", e)
        got = self.lookup(key)
        if got is not None:
            return got
        return self.remember(key, self.decompose_size(e, None))

    def cond(self, e: sympy.Basic) -> str:
        """An ``i1`` value for a size predicate."""
        if e in (sympy.true, True):
            return self.const(True, DType.bool)
        if e in (sympy.false, False):
            return self.const(False, DType.bool)
        key = ("cond", e)
        got = self.lookup(key)
        if got is not None:
            return got
        if not isinstance(e, _PREDICATES):
            raise self.error(f"cannot emit size predicate {expr_str(e)}")
        return self.remember(key, self.decompose_size(e, None))

    def visit_size(self, e: Any, ctx: Any = None) -> str:
        e = sympy.sympify(e)
        return self.cond(e) if isinstance(e, _PREDICATES) or e in (sympy.true, sympy.false) else self.idx(e)

    def _bin(self, op: str, a: str, b: str, ty: str = "index") -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.{op} {a}, {b} : {ty}")
        return r

    # -- the visitor's hooks ---------------------------------------------------------
    def on_integer(self, value: int) -> str:
        return self.cindex(value)

    def on_boolean(self, value: bool) -> str:
        return self.const(value, DType.bool)

    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
        got = self.lookup(("sym", s))
        if got is None:
            raise self.error(f"size symbol {s} is not bound by any input")
        return got

    def on_add(self, a: str, b: str) -> str:
        return self._bin("addi", a, b)

    def on_mul(self, a: str, b: str) -> str:
        return self._bin("muli", a, b)

    def on_exactdiv(self, a: str, b: str, q: Quotient) -> str:
        return self._bin("divsi", a, b)  # an integer size: the division is exact

    def on_fractional(self, e: sympy.Basic, ctx: Any) -> str:
        # an ``index`` is an integer: whatever reaches here is one sympy cannot prove
        q = quotient(e)
        return self.on_exactdiv(self.visit_size(q.num), self.visit_size(q.den), q)

    def on_floordiv(self, a: str, b: str, q: Quotient) -> str:
        return self._bin("floordivsi", a, b)

    def on_ceildiv(self, a: str, b: str, q: Quotient) -> str:
        return self._bin("ceildivsi", a, b)

    def on_mod(self, a: str, b: str, q: Quotient) -> str:
        # remsi takes the dividend's sign; Mod takes the divisor's
        return self._bin("subi", a, self._bin("muli", self.on_floordiv(a, b, q), b))

    def on_min(self, a: str, b: str) -> str:
        return self._bin("minsi", a, b)

    def on_max(self, a: str, b: str) -> str:
        return self._bin("maxsi", a, b)

    def on_compare(self, op: str, a: str, b: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.cmpi {_CMPI[op]}, {a}, {b} : index")
        return r

    def on_and(self, a: str, b: str) -> str:
        return self._bin("andi", a, b, "i1")

    def on_or(self, a: str, b: str) -> str:
        return self._bin("ori", a, b, "i1")

    def on_not(self, a: str) -> str:
        return self._bin("xori", a, self.const(True, DType.bool), "i1")

    def on_select(self, cond: str, then: str, other: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.select {cond}, {then}, {other} : index")
        return r

    def on_unsupported(self, e: sympy.Basic, ctx: Any) -> str:
        raise self.error(f"cannot emit size expression {expr_str(e)}")

    def flt(self, e: sympy.Basic) -> str:
        """An ``f64`` value for a float-valued size expression (``x_2**(-0.5)``): the
        visitor's float walk (see [Note: float size semantics])."""
        return self.visit_float(e)

    def visit_float(self, e: Any, ctx: Any = None) -> str:
        e = sympy.sympify(e)
        if e.is_Number:
            return self.on_float(float(e))
        key = ("flt", e)
        got = self.lookup(key)
        if got is not None:
            return got
        return self.remember(key, self.decompose_float(e, None))

    # -- the float walk's hooks (f64) --------------------------------------------------
    def on_float(self, value: float) -> str:
        return self.const(value, DType.f64)

    def on_to_float(self, a: str) -> str:
        i = self.i64_of_index(a)
        r = self.fresh()
        self.emit(f"{r} = arith.sitofp {i} : i64 to f64")
        return r

    def on_fadd(self, a: str, b: str) -> str:
        return self._bin("addf", a, b, "f64")

    def on_fmul(self, a: str, b: str) -> str:
        return self._bin("mulf", a, b, "f64")

    def on_fpow(self, base: str, exp: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = math.powf {base}, {exp} : f64")
        return r

    def on_unsupported_float(self, e: sympy.Basic, ctx: Any) -> str:
        raise self.error(f"cannot emit float expression {expr_str(e)}")

    def i64_of_index(self, v: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.index_cast {v} : index to i64")
        return r


__all__ = ["SizeEmitter"]
