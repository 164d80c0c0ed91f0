"""Size expressions as MLIR ``index`` arithmetic: sympy sizes (``floor(x_0/2)``,
``Max``, ``Piecewise``), size predicates as ``i1`` and float-valued size expressions as
``f64``. A size symbol is bound once from an input's ``tensor.dim`` (or a loop index).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.mlir.module import ModuleBuilder
from cuvil_ir.symbolic import Dim, expr_str


class SizeEmitter(ModuleBuilder):
    """Size expressions, predicates and float sizes, each emitted once per scope."""

    def idx(self, e: Dim | sympy.Basic) -> str:
        """An ``index`` value for an integer size expression."""
        if isinstance(e, (int, sympy.Integer)):
            return self.cindex(int(e))
        e = sympy.sympify(e)
        key = ("idx", e)
        got = self.lookup(key)
        if got is not None:
            return got
        r = self._idx(e)
        return self.remember(key, r)

    def _bin(self, op: str, a: str, b: str, ty: str = "index") -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.{op} {a}, {b} : {ty}")
        return r

    def _idx(self, e: sympy.Basic) -> str:
        if isinstance(e, sympy.Symbol):
            got = self.lookup(("sym", e))
            if got is None:
                raise self.error(f"size symbol {e} is not bound by any input")
            return got
        if isinstance(e, sympy.Piecewise):
            args = list(e.args)
            *rest, (last, _) = args
            acc = self.idx(last)
            for val, cond in reversed(rest):
                c = self.cond(cond)
                r = self.fresh()
                self.emit(f"{r} = arith.select {c}, {self.idx(val)}, {acc} : index")
                acc = r
            return acc
        # [Note: size division semantics] sympy's floor, ceiling and Mod are Python's (Mod
        # takes the divisor's sign), and a size expression can be negative -- a loop index
        # (``range(-4, n)``), or ``x_0 - 7`` at a small size -- so floor and ceiling are
        # floordivsi/ceildivsi (rounding toward -inf/+inf, not toward zero as divsi does),
        # and Mod is ``a - floordiv(a, b) * b``: remsi alone takes the dividend's sign.
        # test_mlir checks both against Python on negative operands.
        if isinstance(e, sympy.floor) or isinstance(e, sympy.ceiling):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self.idx(num)
            op = "floordivsi" if isinstance(e, sympy.floor) else "ceildivsi"
            return self._bin(op, self.idx(num), self.idx(den))
        if isinstance(e, sympy.Mod):
            a, b = self.idx(e.args[0]), self.idx(e.args[1])
            return self._bin("subi", a, self._bin("muli", self._bin("floordivsi", a, b), b))
        if isinstance(e, (sympy.Max, sympy.Min)):
            op = "maxsi" if isinstance(e, sympy.Max) else "minsi"
            acc = self.idx(e.args[0])
            for a in e.args[1:]:
                acc = self._bin(op, acc, self.idx(a))
            return acc
        num, den = sympy.fraction(sympy.together(e))
        if den != 1:  # an integer size: the division is exact, so truncating is flooring
            return self._bin("divsi", self.idx(num), self.idx(den))
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            acc = self.idx(terms[0])
            for t in terms[1:]:
                acc = self._bin("addi", acc, self.idx(t))
            return acc
        if isinstance(e, sympy.Mul):
            terms = sorted(e.args, key=sympy.default_sort_key)
            acc = self.idx(terms[0])
            for t in terms[1:]:
                acc = self._bin("muli", acc, self.idx(t))
            return acc
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base = self.idx(e.base)
            acc = base
            for _ in range(int(e.exp) - 1):
                acc = self._bin("muli", acc, base)
            return acc
        raise self.error(f"cannot emit size expression {expr_str(e)}")

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
        preds = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.Lt: "slt", sympy.Le: "sle"}
        preds.update({sympy.Gt: "sgt", sympy.Ge: "sge"})
        r: str
        if type(e) in preds:
            r = self.fresh()
            a, b = self.idx(e.lhs), self.idx(e.rhs)
            self.emit(f"{r} = arith.cmpi {preds[type(e)]}, {a}, {b} : index")
        elif isinstance(e, (sympy.And, sympy.Or)):
            op = "andi" if isinstance(e, sympy.And) else "ori"
            r = self._fold(op, e.args, self.cond, "i1")
        elif isinstance(e, sympy.Not):
            r = self._bin("xori", self.cond(e.args[0]), self.const(True, DType.bool), "i1")
        else:
            raise self.error(f"cannot emit size predicate {expr_str(e)}")
        return self.remember(key, r)

    def _fold(self, op: str, args: Sequence[sympy.Basic], each: Callable[[sympy.Basic], str], ty: str) -> str:
        """``op`` over the values of ``args`` in canonical order, left to right."""
        ordered = sorted(args, key=sympy.default_sort_key)
        r = each(ordered[0])
        for a in ordered[1:]:
            r = self._bin(op, r, each(a), ty)
        return r

    def flt(self, e: sympy.Basic) -> str:
        """An ``f64`` value for a float-valued size expression (``x_2**(-0.5)``)."""
        e = sympy.sympify(e)
        if e.is_Number:
            return self.const(float(e), DType.f64)
        key = ("flt", e)
        got = self.lookup(key)
        if got is not None:
            return got
        r: str
        if e.is_integer:
            i = self.i64_of_index(self.idx(e))
            r = self.fresh()
            self.emit(f"{r} = arith.sitofp {i} : i64 to f64")
        elif isinstance(e, (sympy.Add, sympy.Mul)):
            op = "addf" if isinstance(e, sympy.Add) else "mulf"
            r = self._fold(op, e.args, self.flt, "f64")
        elif isinstance(e, sympy.Pow):
            r = self.fresh()
            self.emit(f"{r} = math.powf {self.flt(e.base)}, {self.flt(e.exp)} : f64")
        else:
            raise self.error(f"cannot emit float expression {expr_str(e)}")
        return self.remember(key, r)

    def i64_of_index(self, v: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.index_cast {v} : index to i64")
        return r


__all__ = ["SizeEmitter"]
