"""How a kernel's accesses walk its loops, and the loop-shape rewrites that follow from it.

An access offset as an affine form over the loop symbols (:func:`affine`); the
offsets a body reads and indexes (:func:`access_offsets`); merging adjacent loops every
access walks contiguously (:func:`collapse`); tiling a transposing access
(:func:`tile`); loops in the store buffer's layout order (:func:`in_layout_order`).
Pure functions of sympy expressions and loop lists: no policy, no Loop IR nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.tensor_ir import expr as E


def collapse(
    loops: list[tuple[sympy.Symbol, sympy.Expr]], exprs: list[sympy.Expr], opaque: frozenset[sympy.Symbol]
) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], dict[sympy.Symbol, Any]]:
    """Merge adjacent loops (outer j, inner j+1) whose every access is contiguous across them.

    Returns the new loops and a substitution to apply to all offsets (the outer
    symbol becomes 0, the inner one walks the product extent).
    """
    subst: dict[sympy.Symbol, Any] = {}
    loops = list(loops)
    # each distinct offset once, as {loop symbol: coefficient}; None: not affine in the loops
    syms = [s for s, _ in loops]
    forms = [affine(off, syms) for off in dict.fromkeys(sympy.expand(o) for o in exprs)]
    j = len(loops) - 2
    while j >= 0:
        (a, ea), (b, eb) = loops[j], loops[j + 1]
        ok = a not in opaque and b not in opaque
        for form in forms if ok else ():
            if form is None:
                ok = False
                break
            ca, cb = form.get(a, 0), form.get(b, 0)
            if sympy.expand(ca - cb * eb) != 0:
                ok = False
                break
        if ok:
            # b now walks a*eb + b: its coefficient stays, a's disappears
            for form in forms:
                if form is not None:
                    form.pop(a, None)
            subst = {k: v.xreplace({a: 0}) if isinstance(v, sympy.Basic) else v for k, v in subst.items()}
            subst[a] = sympy.Integer(0)
            loops[j] = (b, sympy.expand(ea * eb))
            del loops[j + 1]
        j -= 1
    return loops, subst


def affine(off: sympy.Expr, syms: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, Any] | None:
    """``off`` as ``{sym: coefficient}`` over ``syms`` when it is affine in them (else None)."""
    out: dict[sympy.Symbol, Any] = {}
    wanted = set(syms)
    for term in sympy.Add.make_args(off):
        if not (term.free_symbols & wanted):
            continue
        coeff, dep = term.as_independent(*wanted, as_Add=False)
        if dep not in wanted:
            return None
        out[dep] = out.get(dep, 0) + coeff
    return out


def access_offsets(e: E.Expr) -> list[sympy.Expr]:
    out = []
    for x in E.walk(e):
        if isinstance(x, E.Load):
            out.append(sympy.sympify(x.offset))
        elif isinstance(x, E.Index):
            out.append(sympy.sympify(x.expr))
    return out


def in_layout_order(
    loops: list[tuple[sympy.Symbol, Any]], rank_order: tuple[int, ...] | None
) -> list[tuple[sympy.Symbol, Any]]:
    """``loops`` (over ``_i<d>``) outermost-first in the store buffer's layout ``rank_order``."""
    if rank_order is None:
        return loops
    pos = {d: p for p, d in enumerate(rank_order)}
    return sorted(loops, key=lambda lp: pos[int(lp[0].name[2:])])


def tile(
    loops: list[tuple[sympy.Symbol, Any, Any]], offsets: Sequence[sympy.Expr], size: int
) -> list[tuple[sympy.Symbol, Any, Any]]:
    """Tile the innermost loop ``b`` with a loop ``a`` when an access walks ``a``
    contiguously but ``b`` with a stride (a transposing copy): both run in ``size``
    blocks, so each block of the strided operand is read from cache, not memory.

    ``[.., a, .., b]`` becomes ``[.., ta, .., tb, a in [ta*size, min(ea, ta*size+size)), b ...]``.
    """
    if len(loops) < 2:
        return loops
    b, _, eb = loops[-1]
    syms = [s for s, _, _ in loops]
    forms = [f for f in (affine(sympy.expand(o), syms) for o in offsets) if f is not None]
    pick = None
    for j in range(len(loops) - 2, -1, -1):
        a = loops[j][0]
        if any(f.get(a) == 1 and f.get(b, 0) not in (0, 1) for f in forms):
            pick = j
            break
    if pick is None:
        return loops
    a, _, ea = loops[pick]
    ta, tb = E.tile_symbol(int(a.name[2:])), E.tile_symbol(int(b.name[2:]))
    out = [(ta, sympy.Integer(0), ceil_div(ea, size)) if k == pick else lp for k, lp in enumerate(loops[:-1])]
    out.append((tb, sympy.Integer(0), ceil_div(eb, size)))
    out.append((a, ta * size, sympy.Min(ea, ta * size + size)))
    out.append((b, tb * size, sympy.Min(eb, tb * size + size)))
    return out


def ceil_div(n: Any, d: int) -> sympy.Expr:
    n = sympy.sympify(n)
    return sympy.Integer(-(-int(n) // d)) if n.is_Integer else sympy.floor((n + d - 1) / d)


def outer_extent(outer: Sequence[tuple[sympy.Symbol, sympy.Expr]]) -> Any:
    n: Any = sympy.Integer(1)
    for _, e in outer:
        n = n * e
    return n
