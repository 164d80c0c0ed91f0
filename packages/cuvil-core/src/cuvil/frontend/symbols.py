"""Python-level symbolic sizes seen by user code while tracing.

``x.shape[0]`` is a :class:`SymInt`: arithmetic stays symbolic (a sympy
expression), so ``x.view(x.shape[0] * 2, -1)`` records a symbolic size.
When Python itself needs a concrete answer -- ``bool()`` of a comparison,
``int()``, ``range()`` -- the tracer decides it from the example inputs and
records the decision as an assumption of the graph (a guard at run time).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import sympy

if TYPE_CHECKING:
    from cuvil.frontend.tracer import Tracer


def _expr(v: Any) -> Any:
    if isinstance(v, (SymInt, SymBool)):
        return v.expr
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    if isinstance(v, int):
        return sympy.Integer(v)
    return NotImplemented


class SymInt:
    __slots__ = ("expr", "tracer")

    def __init__(self, expr: sympy.Expr, tracer: Tracer) -> None:
        self.expr = expr
        self.tracer = tracer

    @staticmethod
    def wrap(expr: Any, tracer: Tracer) -> Any:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        return SymInt(expr, tracer)

    def _bin(self, other: Any, fn: Any, reflected: bool = False) -> Any:
        if isinstance(other, float):
            return fn(other, float(self)) if reflected else fn(float(self), other)
        o = _expr(other)
        if o is NotImplemented:
            return NotImplemented
        a, b = (o, self.expr) if reflected else (self.expr, o)
        return SymInt.wrap(fn(a, b), self.tracer)

    def __add__(self, o: Any) -> Any:
        return self._bin(o, operator.add)

    def __radd__(self, o: Any) -> Any:
        return self._bin(o, operator.add, True)

    def __sub__(self, o: Any) -> Any:
        return self._bin(o, operator.sub)

    def __rsub__(self, o: Any) -> Any:
        return self._bin(o, operator.sub, True)

    def __mul__(self, o: Any) -> Any:
        return self._bin(o, operator.mul)

    def __rmul__(self, o: Any) -> Any:
        return self._bin(o, operator.mul, True)

    def __floordiv__(self, o: Any) -> Any:
        return self._bin(o, lambda a, b: sympy.floor(a / b))

    def __rfloordiv__(self, o: Any) -> Any:
        return self._bin(o, lambda a, b: sympy.floor(a / b), True)

    def __mod__(self, o: Any) -> Any:
        return self._bin(o, sympy.Mod)

    def __rmod__(self, o: Any) -> Any:
        return self._bin(o, sympy.Mod, True)

    def __pow__(self, o: Any) -> Any:
        return self._bin(o, operator.pow)

    def __neg__(self) -> Any:
        return SymInt.wrap(-self.expr, self.tracer)

    def __pos__(self) -> SymInt:
        return self

    def __abs__(self) -> Any:
        return SymInt.wrap(sympy.Abs(self.expr), self.tracer)

    def __truediv__(self, o: Any) -> float:
        return float(self) / (float(o) if isinstance(o, SymInt) else o)

    def __rtruediv__(self, o: Any) -> float:
        return o / float(self)

    def _cmp(self, o: Any, rel: Any) -> Any:
        if isinstance(o, float):
            return rel(float(self), o)
        e = _expr(o)
        if e is NotImplemented:
            return NotImplemented
        return SymBool(rel(self.expr, e), self.tracer)

    def __eq__(self, o: object) -> Any:  # type: ignore[override]
        return self._cmp(o, sympy.Eq)

    def __ne__(self, o: object) -> Any:  # type: ignore[override]
        return self._cmp(o, sympy.Ne)

    def __lt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Lt)

    def __le__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Le)

    def __gt__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Gt)

    def __ge__(self, o: Any) -> Any:
        return self._cmp(o, sympy.Ge)

    # Python needs a concrete value: specialise, with a guard.
    def __index__(self) -> int:
        return self.tracer.specialize(self.expr, "used as a Python int")

    __int__ = __index__

    def __float__(self) -> float:
        return float(self.tracer.specialize(self.expr, "used as a Python float"))

    def __bool__(self) -> bool:
        return bool(SymBool(sympy.Ne(self.expr, 0), self.tracer))

    def __hash__(self) -> int:
        return hash(self.tracer.specialize(self.expr, "hashed"))

    def __round__(self, ndigits: Any = None) -> Any:
        return self

    def __trunc__(self) -> int:
        return int(self)

    # Display only: no guard, so printing a size never changes what compiles.
    def __repr__(self) -> str:
        return str(self.tracer.ctx.hint(self.expr))

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(self.tracer.ctx.hint(self.expr), spec)


class SymBool:
    __slots__ = ("expr", "tracer")

    def __init__(self, expr: Any, tracer: Tracer) -> None:
        self.expr = expr
        self.tracer = tracer

    def __bool__(self) -> bool:
        return self.tracer.decide(self.expr)

    def __and__(self, o: Any) -> SymBool:
        return SymBool(sympy.And(self.expr, _expr(o)), self.tracer)

    __rand__ = __and__

    def __or__(self, o: Any) -> SymBool:
        return SymBool(sympy.Or(self.expr, _expr(o)), self.tracer)

    __ror__ = __or__

    def __invert__(self) -> SymBool:
        return SymBool(sympy.Not(self.expr), self.tracer)

    def __repr__(self) -> str:
        return f"SymBool({self.expr})"


class SymShape(tuple):  # type: ignore[type-arg]
    """``x.shape`` while tracing: a tuple of ints and :class:`SymInt`."""

    def numel(self) -> Any:
        n: Any = 1
        for d in self:
            n = n * d
        return n

    def __getitem__(self, i: Any) -> Any:  # type: ignore[override]
        out = tuple.__getitem__(self, i)
        return SymShape(out) if isinstance(i, slice) else out
