"""Index and size expressions as infix source text: what every code generator shares.

A kernel's offsets and extents are sympy expressions of loop indices (``_i0``,
``_r100`` ...) and size symbols. :class:`IndexPrinter` is the
:class:`~cuvil_ir.size_visitor.SizeVisitor` for infix languages: it prints sums,
products and integer powers the same way for every target language, and an index
expression's floor division, ceiling division, modulo and min/max through the
language's hooks (with Python's floor semantics: see [Note: size division semantics]).
A size expression with no loop index and no polynomial form is taken whole, as a
derived argument the wrapper computes exactly (:meth:`IndexPrinter.derived_size`). A code
generator subclasses it for the leaves (literals, symbols) and the hooks. ``ctx`` is
passed through to :meth:`on_symbol` untouched (the Triton generator's lanes).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.size_visitor import Quotient, SizeVisitor, has_rational_form
from cuvil_ir.tensor_ir import expr as E


class IndexPrinter(SizeVisitor[str]):
    #: raised for an expression the language cannot express
    error: type[Exception] = NotImplementedError

    def size_error(self, message: str) -> Exception:
        return self.error(message)

    def on_integer(self, value: int) -> str:
        return str(value)

    @abstractmethod
    def minmax(self, is_min: bool, a: str, b: str) -> str: ...

    @abstractmethod
    def derived_size(self, e: sympy.Expr) -> str:
        """A size expression (no loop index) without a polynomial form."""
        ...

    def print_index(self, value: object, ctx: Any = None) -> str:
        return self.visit_size(value, ctx)

    def take_whole(self, e: sympy.Basic, ctx: Any) -> str | None:
        if any(E.is_loop_symbol(s) for s in e.free_symbols) or _polynomial(e):
            return None
        return self.derived_size(e)

    def fold_size(self, op: str, args: Sequence[sympy.Basic], ctx: Any) -> str:
        if op in ("add", "mul"):
            sep = " + " if op == "add" else " * "
            return "(" + sep.join(self.visit_size(a, ctx) for a in args) + ")"
        return super().fold_size(op, args, ctx)

    def on_min(self, a: str, b: str) -> str:
        return self.minmax(True, a, b)

    def on_max(self, a: str, b: str) -> str:
        return self.minmax(False, a, b)

    def on_ceildiv(self, a: str, b: str, q: Quotient) -> str:
        return f"(-{self.on_floordiv(f'(-{a})', b, q)})"

    def on_compare(self, op: str, a: str, b: str) -> str:
        return f"({a} {op} {b})"

    def on_unsupported(self, e: sympy.Basic, ctx: Any) -> str:
        raise self.size_error(f"index expression {e} has no {self.language} form")

    def on_fractional(self, e: sympy.Basic, ctx: Any) -> str:
        return self.on_unsupported(e, ctx)


def _polynomial(e: sympy.Basic) -> bool:
    """Sums, products and positive integer powers of integers, with no denominator."""
    if isinstance(e, sympy.Pow):
        if not (e.exp.is_Integer and int(e.exp) > 0 and e.base.is_integer):
            return False
    elif not isinstance(e, (sympy.Add, sympy.Mul)):
        return False
    return not has_rational_form(e)


__all__ = ["IndexPrinter"]
