"""Scalar expressions: the body of every kernel, shared by Tensor IR and Loop IR.

An expression computes one element of a tensor. Indices are sympy symbols
(``_i0 …`` for the element being computed, ``_r0 …`` for reduction indices);
size symbols of the graph (``x_0``) appear in offsets and extents. Expressions are
frozen and compare structurally, so equal subexpressions are found by hashing
(the scheduler hoists one accumulator per distinct ``Reduce``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Union

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.scalar_functions import TABLE as SCALAR_FUNCTIONS
from cuvil_ir.symbolic import expr_str as sexpr


def index_symbol(k: int) -> sympy.Symbol:
    """The placeholder for dimension ``k`` of the element being computed."""
    return sympy.Symbol(f"_i{k}", integer=True, nonnegative=True)


def reduce_symbol(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"_r{k}", integer=True, nonnegative=True)


def tile_symbol(k: int) -> sympy.Symbol:
    """The index of a tile of loop ``_i<k>`` (Loop IR's tiling pass)."""
    return sympy.Symbol(f"_t{k}", integer=True, nonnegative=True)


def is_loop_symbol(s: sympy.Basic) -> bool:
    return isinstance(s, sympy.Symbol) and s.name.startswith(("_i", "_r", "_t"))


@dataclass(frozen=True, slots=True)
class Const:
    value: bool | int | float
    dtype: DType


@dataclass(frozen=True, slots=True)
class Arg:
    """A scalar argument of the program (a Python number passed to the compiled function)."""

    name: str
    dtype: DType


@dataclass(frozen=True, slots=True)
class Load:
    buf: str
    offset: sympy.Expr
    dtype: DType


@dataclass(frozen=True, slots=True)
class Index:
    """An index (or size) expression used as a value."""

    expr: sympy.Expr
    dtype: DType


@dataclass(frozen=True, slots=True)
class Call:
    """``fn(*args)``; ``fn`` is one of :data:`FUNCTIONS` (``cast`` converts to ``dtype``)."""

    fn: str
    args: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True, slots=True)
class Reduce:
    """``kind`` of ``body`` over every value of ``ranges`` (symbol, extent) pairs."""

    kind: str
    body: Expr
    ranges: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    dtype: DType


@dataclass(frozen=True, slots=True)
class Var:
    """A local scalar of a loop nest (a hoisted reduction's accumulator)."""

    name: str
    dtype: DType


Expr = Union[Const, Arg, Load, Index, Call, Reduce, Var]

#: scalar functions and their arity; the code generators implement exactly these (the
#: table of what each one is: :data:`cuvil_ir.scalar_functions.TABLE`).
#: ``rand(seed, counter)`` is a uniform float in [0, 1) from the counter-based
#: Philox4x32-10 generator: the same seed and element give the same number on
#: every backend, thread count and schedule.
FUNCTIONS: dict[str, int] = {f.name: f.arity for f in SCALAR_FUNCTIONS.values()}

#: functions whose cost dominates a pointwise chain (the fusion policy counts them)
TRANSCENDENTAL = frozenset(f.name for f in SCALAR_FUNCTIONS.values() if f.transcendental)

REDUCE_KINDS = ("sum", "prod", "max", "min", "any", "all")

#: [Note: native calls] A composite op with a native lowering for the target (a
#: ``cu.custom_op(..., lower={"cpu": "x / (k + fabsf(x))"})``) becomes one ``Call``
#: whose ``fn`` is ``native:<name>:<params>:<body>``: the expression in the target's
#: kernel language, over parameters named like the op's operands and attributes,
#: every one of the call's dtype. The text travels with the expression (and so with
#: the program's text and hash, and the program cache); each code generator defines
#: it once per kernel as a helper of its language and calls it.
NATIVE = "native:"


def native_call(name: str, params: tuple[str, ...], body: str, args: tuple[Expr, ...], dtype: DType) -> Call:
    """The call of a native lowering (see [Note: native calls])."""
    if not name.isidentifier() or not all(p.isidentifier() for p in params) or len(params) != len(args):
        raise ValueError(f"native call {name}({', '.join(params)}) with {len(args)} arguments")
    return Call(f"{NATIVE}{name}:{','.join(params)}:{body}", args, dtype)


def native_parts(fn: str) -> tuple[str, tuple[str, ...], str] | None:
    """``(name, params, body)`` of a native call's ``fn``; ``None`` for a built-in function."""
    if not fn.startswith(NATIVE):
        return None
    name, params, body = fn[len(NATIVE) :].split(":", 2)
    return name, tuple(params.split(",")) if params else (), body


def make_reduce(
    kind: str, body: Expr, ranges: tuple[tuple[sympy.Symbol, sympy.Expr], ...], dtype: DType
) -> Reduce:
    """A Reduce whose bound symbols are named canonically: ``_r{100*depth + k}``, where
    depth is one more than the deepest Reduce in ``body``. Two reductions built apart
    from the same parts compare equal (so a kernel computes them once), and nested
    reductions never share a symbol."""
    depth = 1 + max(
        (int(r.ranges[0][0].name[2:]) // 100 for r in walk(body) if isinstance(r, Reduce)), default=0
    )
    names = {s: reduce_symbol(100 * depth + k) for k, (s, _) in enumerate(ranges)}
    body = substitute(body, names)
    return Reduce(kind, body, tuple((names[s], n) for s, n in ranges), dtype)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Reduce):
        return (e.body,)
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """``e`` and every subexpression, parents before children."""
    yield e
    for c in children(e):
        yield from walk(c)


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` returns a replacement for a node or ``None`` to keep it."""
    memo: dict[Expr, Expr] = {}

    def go(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        if isinstance(x, Call):
            args = tuple(go(a) for a in x.args)
            y: Expr = x if args == x.args else Call(x.fn, args, x.dtype)
        elif isinstance(x, Reduce):
            body = go(x.body)
            y = x if body == x.body else Reduce(x.kind, body, x.ranges, x.dtype)
        else:
            y = x
        out = fn(y)
        memo[x] = y if out is None else out
        return memo[x]

    return go(e)


def replace(e: Expr, old: Expr, new: Expr) -> Expr:
    """``e`` with every occurrence of the subexpression ``old`` replaced by ``new``."""
    return transform(e, lambda x: new if x == old else None)


def substitute(e: Expr, mapping: Mapping[sympy.Basic, sympy.Basic]) -> Expr:
    """Replace index (or size) symbols in every offset, index and extent, simultaneously."""
    if not mapping:
        return e
    m = dict(mapping)

    def sub(x: Expr) -> Expr | None:
        if isinstance(x, Load):
            return Load(x.buf, sympy.sympify(x.offset).xreplace(m), x.dtype)
        if isinstance(x, Index):
            return Index(sympy.sympify(x.expr).xreplace(m), x.dtype)
        if isinstance(x, Reduce):
            ranges = tuple((s, sympy.sympify(n).xreplace(m)) for s, n in x.ranges)
            return Reduce(x.kind, x.body, ranges, x.dtype) if ranges != x.ranges else None
        return None

    return transform(e, sub)


def free_indices(e: Expr) -> frozenset[sympy.Symbol]:
    """Loop symbols ``e`` depends on (a Reduce binds its own)."""
    if isinstance(e, Load):
        return frozenset(s for s in sympy.sympify(e.offset).free_symbols if is_loop_symbol(s))
    if isinstance(e, Index):
        return frozenset(s for s in sympy.sympify(e.expr).free_symbols if is_loop_symbol(s))
    if isinstance(e, Call):
        out: frozenset[sympy.Symbol] = frozenset()
        for a in e.args:
            out |= free_indices(a)
        return out
    if isinstance(e, Reduce):
        bound = {s for s, _ in e.ranges}
        extents = frozenset(
            s for _, n in e.ranges for s in sympy.sympify(n).free_symbols if is_loop_symbol(s)
        )
        return (free_indices(e.body) - bound) | extents
    return frozenset()


def buffers_read(e: Expr) -> frozenset[str]:
    return frozenset(x.buf for x in walk(e) if isinstance(x, Load))


def size(e: Expr) -> int:
    return sum(1 for _ in walk(e))


def cost(e: Expr) -> int:
    """A rough cost of evaluating ``e`` once: calls 1, transcendental 4, a Reduce 16 + its body."""
    total = 0
    for x in walk(e):
        if isinstance(x, Call):
            total += 4 if x.fn in TRANSCENDENTAL else 1
        elif isinstance(x, Reduce):
            total += 16
    return total


def expr_str(e: Expr) -> str:
    """Canonical text of an expression (Tensor IR and Loop IR printers use it)."""
    if isinstance(e, Const):
        v = e.value
        if isinstance(v, float):
            return repr(v) if v == v else "nan"
        return str(v).lower() if isinstance(v, bool) else str(v)
    if isinstance(e, Arg):
        return f"${e.name}"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        return f"%{e.buf}[{sexpr(e.offset)}]"
    if isinstance(e, Index):
        return f"idx({sexpr(e.expr)})"
    if isinstance(e, Call):
        name = f"cast<{e.dtype.value}>" if e.fn == "cast" else e.fn
        return f"{name}({', '.join(expr_str(a) for a in e.args)})"
    ranges = ", ".join(f"{s} < {sexpr(n)}" for s, n in e.ranges)
    return f"{e.kind}({ranges}: {expr_str(e.body)})"
