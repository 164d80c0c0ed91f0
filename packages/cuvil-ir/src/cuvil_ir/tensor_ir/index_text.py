"""Index and size expressions as infix source text: what every code generator shares.

A kernel's offsets and extents are sympy expressions of loop indices (``_i0``,
``_r100`` ...) and size symbols. :class:`IndexPrinter` prints their polynomial part
(sums, products, integer powers) the same way for every target language; a code
generator subclasses it for the leaves (literals, symbols) and for what each
language spells its own way (min/max, floor division and modulo of loop indices,
and size expressions with no polynomial form, which become derived arguments).
``ctx`` is passed through to the hooks untouched (the Triton generator's lanes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import sympy

from cuvil_ir.tensor_ir import expr as E


class IndexPrinter(ABC):
    #: the target language, for error messages
    language = "source"
    #: raised for an expression the language cannot express
    error: type[Exception] = NotImplementedError

    def integer(self, value: int) -> str:
        return str(value)

    @abstractmethod
    def symbol(self, s: sympy.Symbol, ctx: Any) -> str: ...

    @abstractmethod
    def minmax(self, is_min: bool, a: str, b: str) -> str: ...

    @abstractmethod
    def mod(self, a: sympy.Expr, b: sympy.Expr, ctx: Any) -> str: ...

    @abstractmethod
    def floordiv(self, num: sympy.Expr, den: sympy.Expr, ctx: Any) -> str: ...

    @abstractmethod
    def derived_size(self, e: sympy.Expr) -> str:
        """A size expression (no loop index) without a polynomial form."""
        ...

    def print_index(self, value: object, ctx: Any = None) -> str:
        e: Any = sympy.sympify(value)
        if e.is_Integer:
            return self.integer(int(e))
        if isinstance(e, sympy.Symbol):
            return self.symbol(e, ctx)
        loop = any(E.is_loop_symbol(s) for s in e.free_symbols)
        if isinstance(e, (sympy.Add, sympy.Mul)) and not (
            isinstance(e, sympy.Mul) and any(a.is_Rational and not a.is_Integer for a in e.args)
        ):
            op = " + " if isinstance(e, sympy.Add) else " * "
            return (
                "("
                + op.join(self.print_index(a, ctx) for a in sorted(e.args, key=sympy.default_sort_key))
                + ")"
            )
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0 and e.base.is_integer:
            return "(" + " * ".join([self.print_index(e.base, ctx)] * int(e.exp)) + ")"
        if isinstance(e, (sympy.Min, sympy.Max)) and loop:
            text = self.print_index(e.args[0], ctx)
            for arg in e.args[1:]:
                text = self.minmax(isinstance(e, sympy.Min), text, self.print_index(arg, ctx))
            return text
        if isinstance(e, sympy.Mod) and loop:
            return self.mod(e.args[0], e.args[1], ctx)
        if isinstance(e, sympy.floor) and loop:
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if any(E.is_loop_symbol(s) for s in den.free_symbols):
                raise self.error(f"index expression {e}")
            return self.floordiv(sympy.expand(num), den, ctx)
        if loop:
            raise self.error(f"index expression {e} has no {self.language} form")
        return self.derived_size(e)


__all__ = ["IndexPrinter"]
