"""The values lowering computes with, and the index arithmetic over them.

A value is a :class:`Lazy` tensor (a function of its index) or a scalar expression.
The mechanism (:mod:`cuvil_ir.tensor_ir.lower`), the per-op rules
(:mod:`cuvil_ir.tensor_ir.rules`) and memory planning (:mod:`cuvil_ir.tensor_ir.memory`)
all use these; this module imports none of them, so each depends on it one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from cuvil_ir.graph_ir.types import SCALAR_DTYPES as SCALAR_DTYPES  # the one table, re-exported
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import Dim, equal_classes
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import contiguous_strides


class NotLowered(Exception):
    """An op (or this use of it) has no kernel lowering: it runs as an extern call."""


@dataclass(frozen=True)
class Lazy:
    """A tensor as a function of its index: ``body`` over ``_i0 .. _i{rank-1}``."""

    shape: tuple[Dim, ...]
    dtype: DType
    body: E.Expr

    @property
    def rank(self) -> int:
        return len(self.shape)

    def at(self, idx: Sequence[Any]) -> E.Expr:
        """The element at ``idx`` (sympy index expressions, one per dimension)."""
        if len(idx) != self.rank:
            raise ValueError(f"rank {self.rank} tensor indexed with {len(idx)} indices")
        return E.substitute(
            self.body,
            {E.index_symbol(k): sympy.sympify(i) for k, i in enumerate(idx) if i != E.index_symbol(k)},
        )


Val = Lazy | E.Expr  # a tensor, or a scalar expression


def as_dim(e: Any) -> Dim:
    """A size expression as a :data:`~cuvil_ir.symbolic.Dim`: a plain int when it is one."""
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else e


def idx(rank: int) -> list[sympy.Symbol]:
    return [E.index_symbol(k) for k in range(rank)]


def strided_offset(strides: Sequence[Dim], index: Sequence[Any], base: Any = 0) -> sympy.Expr:
    off: Any = sympy.sympify(base)
    for i, s in zip(index, strides):
        off = off + sympy.sympify(i) * s
    return sympy.expand(off)


def linear_offset(shape: Sequence[Dim], index: Sequence[Any], base: Any = 0) -> sympy.Expr:
    """The offset of ``index`` in a row-major array of ``shape``."""
    return strided_offset(contiguous_strides(tuple(shape)), index, base)


def strided_view(lz: Lazy) -> tuple[str, tuple[Dim, ...], Dim] | None:
    """``(buffer, strides, offset)`` when ``lz`` is an affine view of one buffer."""
    if not isinstance(lz.body, E.Load):
        return None
    off = sympy.expand(lz.body.offset)
    syms = idx(lz.rank)
    base = sympy.sympify(off.xreplace({s: 0 for s in syms}))
    strides = []
    for s in syms:
        c = off.coeff(s)
        if c.free_symbols & set(syms) or E.is_loop_symbol(c):
            return None
        strides.append(c)
    rebuilt = base + sum((c * s for c, s in zip(strides, syms)), sympy.Integer(0))
    if sympy.expand(rebuilt - off) != 0 or any(E.is_loop_symbol(s) for s in base.free_symbols):
        return None
    return lz.body.buf, tuple(as_dim(c) for c in strides), as_dim(base)


def known_sizes(assumptions: Sequence[sympy.Basic]) -> dict[sympy.Basic, Any]:
    """Sizes the graph's assumptions pin down: ``Eq(s, 1)`` gives ``s -> 1``, symbols
    ``Eq(a, b)`` says are equal are one class (:func:`~cuvil_ir.symbolic.equal_classes`),
    named by the integer one of them is assumed to be or else by its first name
    (``Eq(b, a)``, ``Eq(b, 2)`` give ``a -> 2`` and ``b -> 2``, in any order), a linear
    fact of one unknown gives its value (``Eq(2*k, 4)``), and ``Eq(e, 1)`` of an
    expression (a ``Piecewise`` size merged from the branches of an ``if``) gives
    ``e -> 1``: such a dim broadcasts like a literal 1."""
    first = equal_classes(assumptions)
    value: dict[sympy.Symbol, sympy.Integer] = {}  # per class (its first name)
    expressions: dict[sympy.Basic, Any] = {}
    for a in assumptions:
        if not isinstance(a, sympy.Eq):
            continue
        lhs, rhs = a.lhs, a.rhs
        if isinstance(rhs, sympy.Symbol) and not isinstance(lhs, sympy.Symbol):
            lhs, rhs = rhs, lhs
        if lhs.is_Integer and not rhs.is_Number:
            lhs, rhs = rhs, lhs
        if not isinstance(lhs, sympy.Symbol):
            if rhs.is_Integer and not lhs.is_Number:
                expressions[lhs] = rhs  # xreplace matches it as a whole, before its parts
        elif rhs.is_Integer:
            value.setdefault(first.get(lhs, lhs), rhs)

    def symbols() -> dict[sympy.Basic, Any]:
        named: dict[sympy.Basic, Any] = {s: value.get(c, c) for s, c in first.items()}
        named.update((s, n) for s, n in value.items() if s not in first)
        return {s: v for s, v in named.items() if v != s}

    # an expression of one unknown symbol, linear in it (``2*k_1 == 4``, ``4*v_3*q_1 == 32``
    # with q_1 known to be 1), gives that symbol's value when it is a whole number
    out = symbols()
    for _ in range(len(expressions)):
        learnt = False
        for e, n in expressions.items():
            e2 = sympy.expand(e.xreplace(out))
            free = e2.free_symbols
            if len(free) != 1 or not e2.is_polynomial(*free):
                continue
            (x,) = free
            poly = sympy.Poly(e2 - n, x)
            if poly.degree() != 1:
                continue
            a, b = poly.all_coeffs()
            if a.is_Integer and b.is_Integer and b % a == 0 and -b // a >= 0:
                c = first.get(x, x)
                if c not in value:
                    value[c] = sympy.Integer(-b // a)
                    learnt = True
        if not learnt:
            break
        out = symbols()
    renamed = dict(out)
    for e, n in expressions.items():
        out[e] = n
        e2 = e.xreplace(renamed)
        if e2 != e and not e2.is_Number:
            out.setdefault(e2, n)
    return {k: v for k, v in out.items() if k not in sympy.sympify(v).free_symbols}
