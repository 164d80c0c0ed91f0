"""Symbolic sizes: sympy expressions over named, non-negative integer symbols.

A dimension (`Dim`) is either a Python ``int`` or a ``sympy.Expr``. Symbols are
created through :func:`symbol` so every symbol of a given name carries the same
assumptions and compares equal everywhere (sympy symbols are interned by name
*and* assumptions).

[Note: assumptions and decisions]
Shape rules sometimes need to know a fact that sympy cannot prove from the
types alone, e.g. whether two symbolic dimensions are equal when broadcasting.
They ask a :class:`ShapeContext`. While tracing, the context answers from the
example inputs (hints) and *records* the answer as an assumption; the graph
carries its assumptions, the runtime checks them on every call (guards), and the
verifier replays shape rules against the recorded assumptions. So every fact a
graph relies on is visible in its text.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, Union

import sympy

# sympy's Add imports sympy.tensor.tensor the first time it flattens a sum (~70 ms):
# imported with this module, so a warm start's first call does not pay for it mid-request
import sympy.tensor.tensor  # noqa: F401, E402
from sympy.logic.boolalg import Boolean
from sympy.printing.precedence import precedence
from sympy.printing.pycode import PythonCodePrinter
from sympy.printing.str import StrPrinter

from cuvil_ir.size_visitor import SizeVisitor

Dim = Union[int, sympy.Expr]
Shape = tuple[Dim, ...]

_RESERVED = frozenset(
    {
        "true",
        "false",
        "none",
        "f16",
        "bf16",
        "f32",
        "f64",
        "i8",
        "i16",
        "i32",
        "i64",
        "u8",
        "bool",
        "c64",
        "c128",
    }
)


class UndecidableError(Exception):
    """A shape rule needed a fact that is neither provable nor assumed."""


class DataSizeError(UndecidableError):
    """A fact about a size computed from tensor data was needed: it has no example value."""


def symbol(name: str) -> sympy.Symbol:
    """The size symbol called ``name`` (an integer >= 0)."""
    if name in _RESERVED or not name.isidentifier():
        raise ValueError(f"invalid size symbol name {name!r}")
    return sympy.Symbol(name, integer=True, nonnegative=True)


def as_dim(value: object) -> Dim:
    """Normalise an int-like or sympy value into a canonical `Dim`."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a dimension")
    if isinstance(value, int):
        return value
    if isinstance(value, sympy.Basic):
        expr = sympy.sympify(value)
        if expr.is_Integer:
            return int(expr)
        return expr
    raise TypeError(f"not a dimension: {value!r}")


def free_symbols(dims: Iterable[Dim]) -> frozenset[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for d in dims:
        if isinstance(d, sympy.Basic):
            out |= {s for s in d.free_symbols if isinstance(s, sympy.Symbol)}
    return frozenset(out)


class _Printer(StrPrinter):  # type: ignore[misc]
    """sympy's str form, but relations as calls (``Gt(x_0, 1)``), so an expression
    never contains ``<``/``>`` and can sit inside ``<...>`` in IR text."""

    def _print_Relational(self, expr: Any) -> str:
        name = {">": "Gt", ">=": "Ge", "<": "Lt", "<=": "Le", "==": "Eq", "!=": "Ne"}[expr.rel_op]
        return f"{name}({self._print(expr.lhs)}, {self._print(expr.rhs)})"


_PRINTER = _Printer({"order": "lex"})


def expr_str(expr: sympy.Basic | int) -> str:
    """Canonical text of a size expression or fact (deterministic across processes)."""
    if isinstance(expr, int):
        return str(expr)
    return _expr_str(expr)


@functools.lru_cache(maxsize=1 << 16)
def _expr_str(expr: sympy.Basic) -> str:
    # memoised: the lower IR levels print the same offsets and sizes many times
    return str(_PRINTER.doprint(expr))


def dim_str(dim: Dim) -> str:
    """Canonical text of a dimension."""
    return expr_str(dim)


def parse_dim(text: str) -> Dim:
    return as_dim(parse_expr(text))


@functools.lru_cache(maxsize=1 << 16)
def parse_expr(text: str) -> sympy.Basic:
    """Parse the text printed by :func:`dim_str` (or a relation) back to sympy (memoised:
    sympy's parser tokenizes and evaluates Python source, and a graph's facts are read,
    and canonicalized through here, many times over)."""
    names: dict[str, object] = {}
    for tok in _identifiers(text):
        if tok in _FUNCTIONS:
            names[tok] = _FUNCTIONS[tok]
        else:
            names[tok] = symbol(tok)
    expr: sympy.Basic = sympy.parse_expr(text, local_dict=names, evaluate=True)
    return expr


_FUNCTIONS: dict[str, object] = {
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "Mod": sympy.Mod,
    "Max": sympy.Max,
    "Min": sympy.Min,
    "Eq": sympy.Eq,
    "Ne": sympy.Ne,
    "Gt": sympy.Gt,
    "Ge": sympy.Ge,
    "Lt": sympy.Lt,
    "Le": sympy.Le,
    "Abs": sympy.Abs,
    "Piecewise": sympy.Piecewise,
    "ITE": sympy.ITE,  # sympy writes a condition over Piecewise sizes as an if-then-else
    "And": sympy.And,
    "Or": sympy.Or,
    "Not": sympy.Not,
    "True": sympy.true,
    "False": sympy.false,
}


def _identifiers(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text + " ":
        if ch.isalnum() or ch == "_":
            cur += ch
        else:
            if cur and not cur[0].isdigit():
                out.append(cur)
            cur = ""
    return out


# [Note: exact size arithmetic]
# Size expressions hold rationals (torch's ceil(n/3) reads floor(n/3 + 2/3)). Python
# code printed the usual way computes them in floats: floor(7/3 + 2/3) is
# floor(2.9999999999999996) = 2, so a chunk of 7 rows had pieces of 2, not 3. Code that
# evaluates sizes at run time (guards, the cpu wrapper's shapes) is printed exactly:
# rationals and divisions as fractions.Fraction, floor/ceil as math.floor/ceil (exact
# on Fractions), the rest as plain int arithmetic, which stays int where no rational is.
# Integer-valued nodes go through the shared size visitor (cuvil_ir.size_visitor), as in
# every other language: floor(p/q) is p // q, Mod is %, ceiling(p/q) is -(-p // q).


class _ExactPrinter(PythonCodePrinter):  # type: ignore[misc]
    def __init__(self, settings: dict[str, Any], names: Mapping[sympy.Symbol, str]) -> None:
        super().__init__(settings)
        self._names = names

    def _print_Symbol(self, e: sympy.Symbol) -> str:
        # symbols are printed under their variable names, not renamed in the tree: an
        # xreplace rebuilds every relation (evaluating it, importing sympy modules lazily)
        return self._names.get(e) or str(super()._print_Symbol(e))

    def _print_Rational(self, e: sympy.Rational) -> str:
        return f"Fraction({e.p}, {e.q})"

    def _print_Half(self, e: Any) -> str:
        return "Fraction(1, 2)"

    def _print_Mul(self, e: sympy.Mul) -> str:
        coeff, factors = e.as_coeff_mul()
        parts = [] if coeff == 1 else [self._print(coeff)]
        for f in factors:
            if f.is_Pow and f.exp.is_Integer and f.exp < 0:
                parts.append(f"Fraction(1, {self._print(f.base**-f.exp)})")
            else:
                parts.append(self.parenthesize(f, precedence(e)))
        return "*".join(parts) or "1"

    def _print_Pow(self, e: sympy.Pow, rational: bool = False) -> str:
        if e.exp.is_Integer and e.exp < 0:
            return f"Fraction(1, {self._print(e.base**-e.exp)})"
        return str(super()._print_Pow(e, rational=rational))


#: what :func:`exact_code` text needs in its namespace
EXACT_NAMESPACE: dict[str, Any] = {"math": math, "Fraction": Fraction}


class _ExactCode(SizeVisitor[str]):
    """Integer size arithmetic and predicates as Python (``//`` and ``%`` are already the
    visitor's floor semantics). A polynomial (no rounding, modulo, min/max or branch
    inside) and a value that is not an integer (a rational, a float size) are printed
    whole by :class:`_ExactPrinter`, in fractions where there is a denominator."""

    language = "Python"

    def __init__(self, names: Mapping[sympy.Symbol, str]) -> None:
        self.names = names
        self.printer = _ExactPrinter({"fully_qualified_modules": True}, names)

    def printed(self, e: sympy.Basic) -> bool:
        """``e`` is printed whole by :class:`_ExactPrinter`."""
        if isinstance(e, Boolean):
            return False
        return (
            not e.has(*_ROUNDING)
            or e.is_integer is not True
            or any(
                isinstance(a, sympy.Float) or (isinstance(a, sympy.Pow) and not a.exp.is_Integer)
                for a in sympy.preorder_traversal(e)
            )
        )

    def take_whole(self, e: sympy.Basic, ctx: Any) -> str | None:
        return self.on_unsupported(e, ctx) if self.printed(e) else None

    def on_unsupported(self, e: sympy.Basic, ctx: Any) -> str:
        # parenthesized: an operand of the visitor's ``//`` and ``%`` (``2 - x // 3`` is not it)
        return f"({self.printer.doprint(e)})"

    def on_integer(self, value: int) -> str:
        return str(value) if value >= 0 else f"({value})"

    def on_boolean(self, value: bool) -> str:
        return str(value)

    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
        return self.names.get(s) or s.name

    def fold_size(self, op: str, args: Sequence[sympy.Basic], ctx: Any) -> str:
        parts = [self.visit_size(a, ctx) for a in args]
        if op in ("min", "max"):
            return f"{op}({', '.join(parts)})"
        return "(" + f" {_PY_OPS[op]} ".join(parts) + ")"

    def on_floordiv(self, a: str, b: str, q: Any) -> str:
        return f"({a} // {b})"

    def on_ceildiv(self, a: str, b: str, q: Any) -> str:
        return f"(-((-{a}) // {b}))"

    def on_mod(self, a: str, b: str, q: Any) -> str:
        return f"({a} % {b})"

    def on_compare(self, op: str, a: str, b: str) -> str:
        return f"({a} {op} {b})"

    def on_not(self, a: str) -> str:
        return f"(not {a})"

    def on_select(self, cond: str, then: str, other: str) -> str:
        return f"({then} if {cond} else {other})"


_PY_OPS = {"add": "+", "mul": "*", "and": "and", "or": "or"}
#: nodes the visitor decomposes in exact Python (the rest is printed by _ExactPrinter)
_ROUNDING = (sympy.floor, sympy.ceiling, sympy.Mod, sympy.Min, sympy.Max, sympy.Piecewise)


def exact_code(expr: sympy.Basic, names: Mapping[sympy.Symbol, str]) -> str:
    """Python source computing ``expr`` exactly (see [Note: exact size arithmetic]),
    each symbol read from the variable ``names[symbol]``."""
    e = sympy.sympify(expr)
    missing = [s for s in e.free_symbols if s not in names]
    if missing:
        raise KeyError(f"no variable name for {sorted(map(str, missing))}")
    code = _ExactCode(names)
    return str(code.printer.doprint(e)) if code.printed(e) else code.visit_size(e)


def exact_function(symbols: Iterable[sympy.Symbol], expr: sympy.Basic) -> Callable[..., Any]:
    """``expr`` as a Python function of ``symbols`` (positional), computed exactly."""
    symbols = list(symbols)
    names = {s: f"_s{i}" for i, s in enumerate(symbols)}
    args = ", ".join(names[s] for s in symbols)
    code = f"lambda {args}: {exact_code(expr, names)}"
    return eval(code, dict(EXACT_NAMESPACE))  # type: ignore[no-any-return]  # our own printed code


def evaluate(expr: Dim | sympy.Basic, bindings: Mapping[sympy.Symbol, int]) -> int:
    """Value of a size expression once every symbol is bound to an int.

    A float-valued expression (``x_2**(-0.5)``, a scale computed from a size)
    evaluates to a Python float.
    """
    if isinstance(expr, int):
        return expr
    fast = _fast_value(expr, bindings)
    if fast is not None:
        return fast
    value = sympy.sympify(expr.xreplace(dict(bindings)))
    if not value.is_Integer:
        value = sympy.simplify(value)
    if value.is_Integer:
        return int(value)
    if value.is_Number:
        return float(value)  # type: ignore[return-value]
    raise ValueError(f"size expression {dim_str(expr)} did not evaluate to a number ({value})")


# [Note: evaluating a size expression again]
# The runner evaluates the same expressions for every new size binding (a decode step's
# cache length is a new binding each step: its size plan is made again), and sympy's
# xreplace costs ~10 us a term. An expression evaluated a second time is compiled once
# into exact Python (exact_function, the guards' arithmetic: Python's floor semantics,
# integers exact) and called from then on. Only an integer result is taken from it;
# anything else (a float-valued size, a Piecewise the printer lacks) goes the sympy way.
_SEEN: dict[sympy.Basic, Any] = {}
_ONCE = object()
_LIMIT = 1 << 16  # expressions remembered (a long-running process sees many programs)


def _fast_value(expr: sympy.Basic, bindings: Mapping[sympy.Symbol, int]) -> int | None:
    entry = _SEEN.get(expr)
    if entry is None:
        if len(_SEEN) >= _LIMIT:
            _SEEN.clear()
        _SEEN[expr] = _ONCE
        return None
    if entry is _ONCE:
        symbols = tuple(sorted(expr.free_symbols, key=lambda x: x.name))
        try:
            entry = (symbols, exact_function(symbols, expr))
        except Exception:  # noqa: BLE001 -- not printable exactly: the sympy way
            entry = False
        _SEEN[expr] = entry
    if entry is False:
        return None
    symbols, fn = entry
    try:
        value = fn(*[bindings[x] for x in symbols])
    except Exception:  # noqa: BLE001 -- a division by zero, an unbound symbol: as sympy says
        return None
    return value if type(value) is int else None


def evaluate_bool(cond: sympy.Basic, bindings: Mapping[sympy.Symbol, int]) -> bool:
    value = sympy.sympify(cond.xreplace(dict(bindings)))
    if value in (sympy.true, sympy.false):
        return bool(value)
    value = sympy.simplify(value)
    if value in (sympy.true, sympy.false):
        return bool(value)
    raise ValueError(f"condition {expr_str(cond)} did not evaluate to a bool ({value})")


def prove(cond: sympy.Basic) -> bool | None:
    """True/False when sympy can decide ``cond`` from the symbol assumptions alone."""
    if cond in (sympy.true, sympy.false):
        return bool(cond)
    if isinstance(cond, sympy.Rel):
        diff = cond.lhs - cond.rhs
        # sympy's expand can run forever on a Mod of rational functions; such a
        # difference is judged as it stands
        if not diff.has(sympy.Mod):
            diff = sympy.expand(diff)
        if isinstance(cond, sympy.Eq):
            if diff == 0:
                return True
            if diff.is_nonzero:
                return False
            return None
        if isinstance(cond, sympy.Ne):
            if diff == 0:
                return False
            if diff.is_nonzero:
                return True
            return None
        probe = {
            sympy.StrictGreaterThan: diff.is_positive,
            sympy.GreaterThan: diff.is_nonnegative,
            sympy.StrictLessThan: diff.is_negative,
            sympy.LessThan: diff.is_nonpositive,
        }.get(type(cond))
        if probe is None and cond.has(sympy.Min, sympy.Max):
            return _prove_extremes(cond)
        return probe
    return None


def _prove_extremes(cond: sympy.Rel) -> bool | None:
    """An order between sizes with a ``Min``/``Max`` on one side, from orders of its
    arguments (sympy leaves ``Min(k, n) <= n`` undecided): ``Min(a, b) <= c`` holds when
    one argument is at most ``c``, ``Max(a, b) <= c`` when every argument is and fails
    when one is not; mirrored for the right side."""
    if isinstance(cond, (sympy.StrictGreaterThan, sympy.GreaterThan)):
        cond = cond.reversed
    rel = type(cond)
    lhs, rhs = cond.lhs, cond.rhs
    if isinstance(lhs, (sympy.Min, sympy.Max)):
        parts = [prove(rel(a, rhs)) for a in lhs.args]
        return _combine(parts, any_true=isinstance(lhs, sympy.Min))
    if isinstance(rhs, (sympy.Min, sympy.Max)):
        parts = [prove(rel(lhs, a)) for a in rhs.args]
        return _combine(parts, any_true=isinstance(rhs, sympy.Max))
    return None


def _combine(parts: list[bool | None], any_true: bool) -> bool | None:
    """One argument's order decides (``any_true``: one true suffices, one false is not
    enough), or every argument's order does (the other way round)."""
    if any_true:
        if True in parts:
            return True
        return False if all(p is False for p in parts) else None
    if False in parts:
        return False
    return True if all(p is True for p in parts) else None


@functools.lru_cache(maxsize=1 << 16)
def canonical(fact: sympy.Basic) -> sympy.Basic:
    """The form a fact takes after printing and re-reading (the IR text's form), so
    facts recorded while tracing and facts read back from text compare equal."""
    fact = parse_expr(expr_str(sympy.sympify(fact)))
    if isinstance(fact, (sympy.StrictGreaterThan, sympy.GreaterThan)):  # one orientation: Lt/Le
        fact = fact.reversed
    if isinstance(fact, (sympy.Eq, sympy.Ne)):  # symmetric: one order only
        lhs, rhs = sorted(fact.args, key=lambda a: (bool(a.is_Number), sympy.default_sort_key(a)))
        fact = type(fact)(lhs, rhs, evaluate=False)
    return fact


def conjuncts(facts: Iterable[sympy.Basic]) -> Iterator[sympy.Basic]:
    """Each fact, a conjunction as its parts (``Eq(a, b) & Eq(c, 2)``: both)."""
    for f in facts:
        if isinstance(f, sympy.And):
            yield from conjuncts(f.args)
        else:
            yield f


def equal_classes(assumptions: Iterable[sympy.Basic]) -> dict[sympy.Symbol, sympy.Symbol]:
    """Every size symbol an ``Eq(a, b)`` of two symbols names -> the first name (by
    name) of the class of symbols those facts make equal, through others too (a
    union-find: the order of the facts does not matter)."""
    parent: dict[sympy.Symbol, sympy.Symbol] = {}

    def find(s: sympy.Symbol) -> sympy.Symbol:
        while parent.get(s, s) != s:
            s = parent[s]
        return s

    for a in conjuncts(assumptions):
        if isinstance(a, sympy.Eq) and isinstance(a.lhs, sympy.Symbol) and isinstance(a.rhs, sympy.Symbol):
            ra, rb = find(a.lhs), find(a.rhs)
            if ra != rb:
                lo, hi = sorted((ra, rb), key=lambda x: x.name)
                parent[hi] = lo
                parent.setdefault(lo, lo)
    return {s: find(s) for s in parent}


def with_equalities(assumptions: Sequence[sympy.Basic]) -> tuple[sympy.Basic, ...]:
    """The assumptions plus ``Eq(a, b)`` for every two size symbols they make equal
    through others (``Eq(w_0, x_1)`` and ``Eq(b_0, x_1)`` give ``Eq(b_0, w_0)``), since
    the shape rules look facts up one by one: a weight and a bias broadcast alike.

    Memoised on the assumptions: a class of n equal symbols gives n(n-1)/2 facts (a
    decoder's cache layers make classes of dozens), and lowering asks for them at every
    decomposed node of one graph."""
    return _with_equalities(tuple(assumptions))


@functools.lru_cache(maxsize=64)
def _with_equalities(assumptions: tuple[sympy.Basic, ...]) -> tuple[sympy.Basic, ...]:
    classes: dict[sympy.Symbol, list[sympy.Symbol]] = {}
    for s, first in equal_classes(assumptions).items():
        classes.setdefault(first, []).append(s)
    extra: list[sympy.Basic] = []
    for members in classes.values():
        group = sorted(members, key=lambda x: x.name)
        extra += [canonical(sympy.Eq(x, y)) for x, y in itertools.combinations(group, 2)]
    return (*assumptions, *(e for e in extra if e not in assumptions))


class ShapeContext:
    """Answers the facts shape rules ask for; see [Note: assumptions and decisions].

    ``hints`` maps each symbol to its value in the example inputs (tracing);
    without hints (verification) only recorded assumptions and proofs answer.
    """

    __slots__ = (
        "hints",
        "assumptions",
        "reasons",
        "_known",
        "_parts",
        "local_symbols",
        "path",
        "data_symbols",
    )

    def __init__(
        self,
        hints: Mapping[sympy.Symbol, int] | None = None,
        assumptions: Iterable[sympy.Basic] = (),
    ) -> None:
        self.hints: dict[sympy.Symbol, int] | None = dict(hints) if hints is not None else None
        self.assumptions: list[sympy.Basic] = list(assumptions)
        self.reasons: dict[sympy.Basic, str] = {}
        #: symbols (and size expressions) an assumption pins to a value (``Eq(x_1, 16)``,
        #: ``Eq(64*floor(x_0/2), 512)``): substituted before
        #: proving, so facts that follow from them need no assumption of their own
        self._known: dict[sympy.Basic, int] = {}
        #: the conjuncts of assumptions that are conjunctions (a guard on a whole shape,
        #: ``Eq(a_0, b_0) & Eq(a_1, 2)``): each holds on its own
        self._parts: set[sympy.Basic] = set()
        #: symbols bound inside a region (a loop index) -> (first, last) value: a fact
        #: about one must hold over that whole range, or it cannot be used
        self.local_symbols: dict[sympy.Symbol, tuple[Any, Any]] = {}
        #: conditions of the branches being traced or verified: they hold here, and a
        #: fact learnt here is recorded as ``Or(Not(And(*path)), fact)``, so a branch
        #: traced with example sizes on its other side cannot over-constrain the graph
        self.path: list[sympy.Basic] = []
        #: sizes computed from tensor data known to be bound here (verification: they
        #: have no example values, and tracing has none of them either)
        self.data_symbols: set[sympy.Symbol] = set()
        for fact in self.assumptions:
            self._learn(fact)

    def _learn(self, fact: sympy.Basic) -> None:
        if isinstance(fact, sympy.And):
            for part in fact.args:
                self._parts.add(part)
                self._learn(part)
        elif isinstance(fact, sympy.Eq):
            for a, b in ((fact.lhs, fact.rhs), (fact.rhs, fact.lhs)):
                if not b.is_Integer or a.is_number:
                    continue
                # ``Eq(64*floor(8*x_0/y_0), 512)`` pins ``floor(8*x_0/y_0)`` to 8 as well
                c, rest = a.as_coeff_Mul()
                if c.is_Integer and c != 0 and int(b) % int(c) == 0:
                    self._known[rest] = int(b) // int(c)

    def prove(self, cond: sympy.Basic) -> bool | None:
        """``cond`` decided without any assumption or example value: from the symbol
        assumptions, sizes pinned by ``Eq(symbol, int)`` facts, and loop index ranges."""
        proved = prove(cond)
        if proved is None and self._known:
            proved = prove(sympy.sympify(cond.xreplace(self._known)))
        if proved is None and cond.free_symbols & set(self.local_symbols):
            proved = self._prove_over_ranges(cond)
        return proved

    def known(self, cond: sympy.Basic) -> bool | None:
        """``cond`` when it is proved, or follows from the branch conditions or a fact
        already assumed; None when deciding it would take a new assumption."""
        cond = canonical(cond)
        proved = self.prove(cond)
        if proved is not None:
            return proved
        neg = canonical(sympy.Not(cond))
        if cond in self.path:
            return True
        if neg in self.path:
            return False
        # a fact assumed for the whole graph holds on every path; one learnt under
        # the current branch conditions is recorded conditional on them
        for fact, value in ((cond, True), (neg, False)):
            if fact in self.assumptions or fact in self._parts or self._under_path(fact) in self.assumptions:
                return value
        return None

    def decide(self, cond: sympy.Basic, reason: str = "") -> bool:
        cond = canonical(cond)
        known = self.known(cond)
        if known is not None:
            return known
        neg = canonical(sympy.Not(cond))
        local = [v for v in sorted(cond.free_symbols & set(self.local_symbols), key=str)]
        if local:
            return self._decide_at_ends(cond, local[0], reason)
        if self.hints is None:
            if cond.free_symbols & self.data_symbols:
                raise DataSizeError(f"{expr_str(cond)} is about a size computed from tensor data")
            raise UndecidableError(f"cannot decide {expr_str(cond)} without an assumption")
        self._check_hinted(cond, f"whether {expr_str(cond)}")
        value = evaluate_bool(cond, self.hints)
        self.assume(cond if value else neg, reason)
        return value

    def _decide_at_ends(self, cond: sympy.Basic, var: sympy.Symbol, reason: str) -> bool:
        """An inequality linear in a loop index holds over the whole index range iff it
        holds at both ends, so it is decided (and assumed) there, without the index:
        ``Lt(loop1, x_0)`` over ``0..19`` becomes ``Lt(19, x_0)``."""
        first, last = self.local_symbols[var]
        if isinstance(cond, (sympy.StrictLessThan, sympy.LessThan)):
            try:
                linear = sympy.Poly(cond.lhs - cond.rhs, var).degree() <= 1
            except sympy.PolynomialError:
                linear = False
            if linear:
                at_first = self.decide(cond.xreplace({var: first}), reason)
                at_last = self.decide(cond.xreplace({var: last}), reason)
                if at_first == at_last:
                    return at_first
        raise UndecidableError(
            f"this needs a fact about the loop index ({var}) that is not the same for every "
            f"iteration: {expr_str(cond)}"
        )

    def _under_path(self, fact: sympy.Basic) -> sympy.Basic:
        """``fact``, conditional on the branch conditions in force (see ``path``)."""
        if not self.path:
            return fact
        return canonical(sympy.Or(sympy.Not(sympy.And(*self.path)), fact))

    def _prove_over_ranges(self, cond: sympy.Basic) -> bool | None:
        """Decide ``cond`` for every value of the loop indices in it, by writing each
        index as ``first + k`` and as ``last - k`` (k >= 0): a fact that is monotone in
        the index is proved by one of the two."""
        k = sympy.Symbol("_k", integer=True, nonnegative=True)
        for var, (first, last) in self.local_symbols.items():
            if var not in cond.free_symbols:
                continue
            for repl in (first + k, last - k):
                got = prove(sympy.sympify(cond.xreplace({var: repl})))
                if got is not None:
                    cond = sympy.true if got else sympy.false
                    break
        return prove(cond) if not (cond.free_symbols & set(self.local_symbols)) else None

    def assume(self, fact: sympy.Basic, reason: str = "") -> None:
        """Record ``fact`` (conditional on the ``path``) in the canonical form the
        printer/parser round-trip keeps."""
        fact = self._under_path(canonical(fact))
        if fact == sympy.true or fact in self.assumptions:
            return
        local = fact.free_symbols & set(self.local_symbols)
        if local:
            names = ", ".join(sorted(str(s) for s in local))
            raise UndecidableError(f"this needs a fact about the loop index ({names}): {expr_str(fact)}")
        if fact == sympy.false:
            raise UndecidableError("contradictory size assumptions")
        self.assumptions.append(fact)
        self._learn(fact)
        if reason:
            self.reasons.setdefault(fact, reason)

    def equal(self, a: Dim, b: Dim, reason: str = "") -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return self.decide(sympy.Eq(a, b), reason)

    def hint(self, expr: Dim) -> int:
        if isinstance(expr, int):
            return expr
        if self.hints is None:
            raise UndecidableError(f"no example value for {dim_str(expr)}")
        self._check_hinted(expr, f"the value of {dim_str(expr)}")
        return evaluate(expr, self.hints)

    def _check_hinted(self, expr: sympy.Basic, what: str) -> None:
        # a size computed from tensor data (``u0``, see [Note: data-dependent sizes] in
        # cuvil_ir.graph_ir.ops.core) has no example value: deciding on one is an error
        assert self.hints is not None
        unknown = sorted(str(s) for s in expr.free_symbols - set(self.hints) - set(self.local_symbols))
        if unknown:
            raise DataSizeError(
                f"this needs {what}, but {', '.join(unknown)} is a size computed from tensor data, "
                "known only when the compiled code runs"
            )
