"""One walk from a sympy size or index expression to a target language's arithmetic.

Every consumer of size expressions -- the C and Triton index text
(:mod:`cuvil_ir.tensor_ir.index_text`), MLIR ``index`` values
(:mod:`cuvil_ir.mlir.sizes`), ONNX int64 nodes (``cuvil.onnx.export.sizes``) and exact
Python (:func:`cuvil_ir.symbolic.exact_code`) -- subclasses :class:`SizeVisitor`.
The visitor decomposes each sympy node into a few abstract operations and calls the
language's hook for each:

==========================================  ===============================================
sympy node                                  hook(s)
==========================================  ===============================================
``Integer``, ``Symbol``, ``true``/``false`` ``on_integer``, ``on_symbol``, ``on_boolean``
``Add``, ``Mul``, ``Pow`` (exponent > 0)    ``fold_size`` "add"/"mul" (``on_add``, ``on_mul``)
an integer with a rational form             ``on_exactdiv`` (``x*(x + 1)/2``: the division is exact)
``floor(p/q)``, ``ceiling(p/q)``            ``on_floordiv``, ``on_ceildiv``
``Mod(a, b)``                               ``on_mod``
``Min``, ``Max``                            ``fold_size`` "min"/"max" (``on_min``, ``on_max``)
``Eq`` ``Ne`` ``Lt`` ``Le`` ``Gt`` ``Ge``   ``on_compare`` (``"=="``, ``"!="``, ``"<"`` ...)
``And``, ``Or``, ``Not``                    ``fold_size`` "and"/"or" (``on_and``, ``on_or``), ``on_not``
``Piecewise``                               ``on_select``, from the last branch backwards
==========================================  ===============================================

The hooks are named ``on_*`` (and the walk's methods ``*_size``) so that a consumer
mixing the visitor into a larger emitter keeps its own ``add``, ``select`` ...

[Note: size division semantics] Floor division and modulo have one meaning, Python's:
``floordiv`` rounds toward -inf, ``ceildiv`` toward +inf, and ``mod(a, b)`` is
``a - floordiv(a, b) * b`` (its sign is the divisor's). Size expressions can be
negative (a loop index of ``range(-4, n)``, ``x_0 - 7`` at a small size), so a hook
whose native operator differs must build the correct form: C's ``/`` and ``%`` truncate
(``cu_ifloordiv``/``cu_imod``), ONNX's integer ``Div`` truncates (used only when both
operands are known non-negative), MLIR has ``floordivsi``/``ceildivsi`` but ``remsi``
takes the dividend's sign. ``test_size_visitor`` runs negative operands through every
consumer against Python.

A consumer keeps what it owns: the leaves' spelling, the expressions it takes whole
(``take_whole``: the C and Triton generators pass a size expression without a loop index
as a derived argument; exact Python prints polynomials and non-integer values with
sympy's printer), how it caches and orders what it emits (override ``visit_size``,
``visit_float``, ``order_operands``, ``fold_size``, ``fold_float``, ``visit_divisor``), and
``ctx``, passed untouched to ``on_symbol`` (the Triton generator's lanes).

Float-valued size expressions (``x_2**(-0.5)``, the default attention scale; a size over a
size as a float; ``floor(x/3)/2``) have a second walk, :meth:`SizeVisitor.visit_float`,
with hooks of their own:

==========================================  ===============================================
sympy node (float-valued)                   hook(s)
==========================================  ===============================================
a number (``Integer``, ``Rational``,        ``on_float`` (the nearest double: ``1/3`` is
``Float``)                                  ``float(Rational(1, 3))``)
a non-number that is integer-valued         ``on_to_float`` of its value from the integer
(:func:`integer_valued`: a size symbol,     walk above
``floor``, ``Mod``, ...)
``Add``, ``Mul``                            ``fold_float`` "add"/"mul" (``on_fadd``, ``on_fmul``)
``Pow`` (any exponent)                      ``on_fpow`` of the base and the exponent
anything else                               ``on_unsupported_float`` (an error)
==========================================  ===============================================

[Note: float size semantics] A float-valued size expression means its real value. A
double-precision consumer (MLIR ``f64``, ONNX ``DOUBLE``) computes it in this walk: every
integer-valued part exactly, in the integer walk (so ``floor`` and ``Mod`` keep [Note: size
division semantics] on negative operands), converted once; numbers as their nearest
double; ``+``, ``*`` and ``**`` in double, the operands of a sum or product in
``order_operands`` order (a negative exponent is ``pow(b, -n)``, not a division). The
result is within a few ulps of the real value. Exact Python (``exact_code``, which also
computes the C and Triton generators' float-valued derived arguments: they print no float
size themselves) takes such an expression whole and evaluates it with fractions, rounding
once. ``test_size_visitor`` runs negative exponents, rationals, fractional powers and floor
divisions inside float expressions through every consumer against Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import sympy

T = TypeVar("T")

#: sympy relation -> the comparison operator :meth:`SizeVisitor.compare` receives
RELATIONS: dict[type, str] = {
    sympy.Equality: "==",
    sympy.Unequality: "!=",
    sympy.StrictLessThan: "<",
    sympy.LessThan: "<=",
    sympy.StrictGreaterThan: ">",
    sympy.GreaterThan: ">=",
}


class Quotient(NamedTuple):
    """The operands of a division as sympy expressions (``num / den``), for hooks that
    choose a form by what is known about them (their signs)."""

    num: sympy.Expr
    den: sympy.Expr

    @property
    def nonnegative(self) -> bool:
        """Both operands are provably >= 0 (so truncating division is floor division)."""
        return bool(self.num.is_nonnegative is True and self.den.is_nonnegative is True)


def quotient(e: sympy.Expr) -> Quotient:
    """``e`` as one fraction ``num / den`` (``floor(x/3 + 2/3)``'s argument is ``(x + 2)/3``)."""
    num, den = sympy.fraction(sympy.together(e))
    return Quotient(num, den)


def has_rational_form(e: sympy.Basic) -> bool:
    """``e`` is a sum, product or power whose one-fraction form has a denominator."""
    return _has_division(e) and bool(quotient(e).den != 1)


def integer_valued(e: sympy.Basic) -> bool:
    """``e`` is integer-valued as a size expression: sympy proves it, or it is built from
    integers by ``floor``, ``ceiling``, ``Mod``, ``Min``/``Max``, ``+``, ``*`` and positive
    integer powers. sympy leaves ``floor(a/b)`` undecided for nonnegative (not positive)
    symbols, ``a/b`` being ``zoo`` at ``b = 0``; a size division by zero is an error
    anyway, so ``floor``, ``ceiling`` and ``Mod`` of anything are integers here."""
    if e.is_integer is True:
        return True
    if isinstance(e, (sympy.floor, sympy.ceiling, sympy.Mod)):
        return True
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Min, sympy.Max)):
        return all(integer_valued(a) for a in e.args)
    if isinstance(e, sympy.Pow):
        return bool(e.exp.is_Integer and int(e.exp) > 0 and integer_valued(e.base))
    return False


def _has_division(e: sympy.Basic) -> bool:
    """A cheap test before :func:`quotient`: a rational or a negative power in the
    polynomial part of ``e``."""
    if isinstance(e, sympy.Rational):
        return not e.is_Integer
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return any(_has_division(a) for a in e.args)
    if isinstance(e, sympy.Pow):
        return bool(e.exp.is_negative) or _has_division(e.base)
    return False


class SizeVisitor(ABC, Generic[T]):
    """The shared walk; subclasses define the hooks (see the module doc)."""

    #: the target language, for error messages
    language = "source"

    def size_error(self, message: str) -> Exception:
        """The exception raised for an expression the language cannot express."""
        return NotImplementedError(message)

    # -- the walk ------------------------------------------------------------------
    def visit_size(self, e: Any, ctx: Any = None) -> T:
        """The value of ``e``; children are visited through here (override to cache)."""
        return self.decompose_size(sympy.sympify(e), ctx)

    def decompose_size(self, e: Any, ctx: Any) -> T:
        if e is sympy.true or e is sympy.false:
            return self.on_boolean(bool(e))
        if e.is_Integer:
            return self.on_integer(int(e))
        if isinstance(e, sympy.Symbol):
            return self.on_symbol(e, ctx)
        taken = self.take_whole(e, ctx)
        if taken is not None:
            return taken
        if has_rational_form(e):
            if e.is_integer is not True:
                return self.on_fractional(e, ctx)
            q = quotient(e)
            return self.on_exactdiv(self.visit_size(q.num, ctx), self.visit_size(q.den, ctx), q)
        if isinstance(e, sympy.Add):
            return self.fold_size("add", self.order_operands(e.args), ctx)
        if isinstance(e, sympy.Mul):
            return self.fold_size("mul", self.order_operands(e.args), ctx)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return self.fold_size("mul", [e.base] * int(e.exp), ctx)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            q = quotient(e.args[0])
            if q.den == 1:
                return self.visit_size(q.num, ctx)
            a = self.visit_size(q.num, ctx)
            b = self.visit_divisor(q.den, ctx)
            return self.on_floordiv(a, b, q) if isinstance(e, sympy.floor) else self.on_ceildiv(a, b, q)
        if isinstance(e, sympy.Mod):
            q = Quotient(*e.args)
            a = self.visit_size(q.num, ctx)
            return self.on_mod(a, self.visit_divisor(q.den, ctx), q)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self.fold_size("min" if isinstance(e, sympy.Min) else "max", list(e.args), ctx)
        if type(e) in RELATIONS:
            a = self.visit_size(e.lhs, ctx)
            return self.on_compare(RELATIONS[type(e)], a, self.visit_size(e.rhs, ctx))
        if isinstance(e, (sympy.And, sympy.Or)):
            return self.fold_size(
                "and" if isinstance(e, sympy.And) else "or", self.order_operands(e.args), ctx
            )
        if isinstance(e, sympy.Not):
            return self.on_not(self.visit_size(e.args[0], ctx))
        if isinstance(e, sympy.Piecewise):
            *rest, (last, _) = e.args
            acc = self.visit_size(last, ctx)
            for value, cond in reversed(rest):
                c = self.visit_size(cond, ctx)
                acc = self.on_select(c, self.visit_size(value, ctx), acc)
            return acc
        return self.on_unsupported(e, ctx)

    def order_operands(self, args: Sequence[sympy.Basic]) -> list[sympy.Basic]:
        """The operands of a commutative node in the order they are visited."""
        return sorted(args, key=sympy.default_sort_key)

    def fold_size(self, op: str, args: Sequence[sympy.Basic], ctx: Any) -> T:
        """``op`` (add, mul, min, max, and, or) over ``args``, left to right, each operand
        visited just before it is combined."""
        hook = {"add": self.on_add, "mul": self.on_mul, "min": self.on_min, "max": self.on_max}
        hook.update({"and": self.on_and, "or": self.on_or})
        acc = self.visit_size(args[0], ctx)
        for a in args[1:]:
            acc = hook[op](acc, self.visit_size(a, ctx))
        return acc

    def visit_divisor(self, den: sympy.Expr, ctx: Any) -> T:
        """The divisor of floordiv, ceildiv and mod."""
        return self.visit_size(den, ctx)

    # -- the float walk (see [Note: float size semantics]) ------------------------------
    def visit_float(self, e: Any, ctx: Any = None) -> T:
        """The double-precision value of ``e``; children are visited through here (override
        to cache)."""
        return self.decompose_float(sympy.sympify(e), ctx)

    def decompose_float(self, e: Any, ctx: Any) -> T:
        if not isinstance(e, sympy.Expr):  # a predicate, true, false
            return self.on_unsupported_float(e, ctx)
        if e.is_Number:
            return self.on_float(float(e))
        if integer_valued(e):
            return self.on_to_float(self.visit_size(e, ctx))
        if isinstance(e, sympy.Add):
            return self.fold_float("add", self.order_operands(e.args), ctx)
        if isinstance(e, sympy.Mul):
            return self.fold_float("mul", self.order_operands(e.args), ctx)
        if isinstance(e, sympy.Pow):
            base = self.visit_float(e.base, ctx)
            return self.on_fpow(base, self.visit_float(e.exp, ctx))
        return self.on_unsupported_float(e, ctx)

    def fold_float(self, op: str, args: Sequence[sympy.Basic], ctx: Any) -> T:
        """``op`` (add, mul) in double over ``args``, left to right, each operand visited
        just before it is combined."""
        hook = self.on_fadd if op == "add" else self.on_fmul
        acc = self.visit_float(args[0], ctx)
        for a in args[1:]:
            acc = hook(acc, self.visit_float(a, ctx))
        return acc

    # -- what a language may take whole or refuse ----------------------------------
    def take_whole(self, e: sympy.Basic, ctx: Any) -> T | None:
        """A value for ``e`` without decomposing it, or None (decompose)."""
        return None

    def on_fractional(self, e: sympy.Basic, ctx: Any) -> T:
        """A sum or product with a denominator that sympy cannot prove is an integer."""
        raise self.size_error(f"size expression {e} is not an integer and has no {self.language} form")

    def on_unsupported(self, e: sympy.Basic, ctx: Any) -> T:
        raise self.size_error(f"size expression {e} has no {self.language} form")

    def on_unsupported_float(self, e: sympy.Basic, ctx: Any) -> T:
        raise self.size_error(f"float size expression {e} has no {self.language} form")

    # -- leaves --------------------------------------------------------------------
    @abstractmethod
    def on_integer(self, value: int) -> T: ...

    @abstractmethod
    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> T: ...

    def on_boolean(self, value: bool) -> T:
        raise self.size_error(f"boolean {value} has no {self.language} form")

    # -- operations ----------------------------------------------------------------
    def on_add(self, a: T, b: T) -> T:
        raise self.size_error(f"{self.language} has no addition")

    def on_mul(self, a: T, b: T) -> T:
        raise self.size_error(f"{self.language} has no multiplication")

    def on_exactdiv(self, a: T, b: T, q: Quotient) -> T:
        """``a / b`` where the quotient is known to be an integer: any rounding is right."""
        return self.on_floordiv(a, b, q)

    @abstractmethod
    def on_floordiv(self, a: T, b: T, q: Quotient) -> T:
        """``a // b``, rounded toward -inf (see [Note: size division semantics])."""

    def on_ceildiv(self, a: T, b: T, q: Quotient) -> T:
        """``-(-a // b)``, rounded toward +inf."""
        raise self.size_error(f"ceiling division has no {self.language} form")

    @abstractmethod
    def on_mod(self, a: T, b: T, q: Quotient) -> T:
        """``a % b`` with the divisor's sign (``a - floordiv(a, b) * b``)."""

    def on_min(self, a: T, b: T) -> T:
        raise self.size_error(f"min has no {self.language} form")

    def on_max(self, a: T, b: T) -> T:
        raise self.size_error(f"max has no {self.language} form")

    def on_compare(self, op: str, a: T, b: T) -> T:
        raise self.size_error(f"comparison {op} has no {self.language} form")

    def on_and(self, a: T, b: T) -> T:
        raise self.size_error(f"'and' has no {self.language} form")

    def on_or(self, a: T, b: T) -> T:
        raise self.size_error(f"'or' has no {self.language} form")

    def on_not(self, a: T) -> T:
        raise self.size_error(f"'not' has no {self.language} form")

    def on_select(self, cond: T, then: T, other: T) -> T:
        raise self.size_error(f"a conditional size has no {self.language} form")

    # -- float operations (the double-precision walk) --------------------------------
    def on_float(self, value: float) -> T:
        """A number in a float-valued expression, already rounded to the nearest double."""
        raise self.size_error(f"{self.language} has no float sizes")

    def on_to_float(self, a: T) -> T:
        """An integer-valued part (computed by the integer walk) as a double."""
        raise self.size_error(f"{self.language} has no float sizes")

    def on_fadd(self, a: T, b: T) -> T:
        raise self.size_error(f"{self.language} has no float addition")

    def on_fmul(self, a: T, b: T) -> T:
        raise self.size_error(f"{self.language} has no float multiplication")

    def on_fpow(self, base: T, exp: T) -> T:
        """``base ** exp`` in double (``exp`` may be negative or fractional)."""
        raise self.size_error(f"{self.language} has no float power")


__all__ = ["RELATIONS", "Quotient", "SizeVisitor", "has_rational_form", "integer_valued", "quotient"]
