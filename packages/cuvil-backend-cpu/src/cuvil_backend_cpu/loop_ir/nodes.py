"""Loop IR: explicit loop nests over symbolic extents (in the spirit of Exo).

A :class:`LoopFunc` is one kernel: buffer parameters, size parameters and a body
of statements. Loops are ``par`` (split across threads), ``seq``, ``vec`` (SIMD
lanes) or ``parvec`` (both, for one flat loop); a loop that carries reductions
names its accumulators. Scalar expressions are those of
:mod:`cuvil_ir.tensor_ir.expr`, with :class:`~cuvil_ir.tensor_ir.expr.Var` for
locals. The printer is canonical, so a function hashes like every other stage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Union

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import dim_str
from cuvil_ir.symbolic import expr_str as sexpr
from cuvil_ir.tensor_ir.expr import Expr, expr_str

LOOP_KINDS = ("par", "seq", "vec", "parvec")


@dataclass(frozen=True, slots=True)
class Loop:
    """``var`` runs over ``[start, extent)`` (``extent`` is the stop, ``start`` 0 but in tiles)."""

    var: sympy.Symbol
    extent: sympy.Expr
    kind: str
    body: tuple[Stmt, ...]
    #: accumulators this loop reduces into: (local name, reduce kind)
    reduces: tuple[tuple[str, str], ...] = ()
    #: ``par`` loops: run on several threads only when this much work is done (elements)
    work: sympy.Expr | None = None
    start: sympy.Expr | int = 0


@dataclass(frozen=True, slots=True)
class Let:
    """Declare local ``name`` = ``expr`` (immutable, or the initial value of an accumulator)."""

    name: str
    expr: Expr
    dtype: DType
    mutable: bool = False


@dataclass(frozen=True, slots=True)
class Accumulate:
    """``name = combine_kind(name, expr)``."""

    name: str
    kind: str
    expr: Expr


@dataclass(frozen=True, slots=True)
class Store:
    buf: str
    offset: sympy.Expr
    expr: Expr


@dataclass(frozen=True, slots=True)
class Prefetch:
    """A hint: bring ``extent`` elements of ``buf`` from ``offset`` on into cache, when
    ``var + 1 < limit`` (``offset`` is written for the next iteration of ``var``). Never
    changes a value; the C generator may cap how much of a long run it touches."""

    buf: str
    offset: sympy.Expr
    extent: sympy.Expr
    var: sympy.Symbol
    limit: sympy.Expr


@dataclass(frozen=True, slots=True)
class Scratch:
    """A local array ``name`` of ``extent`` elements of ``dtype`` for the statements of
    ``body``: where a half-precision row kernel keeps a value a reduction phase computed
    (softmax's ``exp(x - max)``) at float32 precision for its store to read back, as a
    float32 kernel keeps it in its own output row (``statements.find_stash``)."""

    name: str
    dtype: DType
    extent: sympy.Expr
    body: tuple[Stmt, ...]


Stmt = Union[Loop, Let, Accumulate, Store, Prefetch, Scratch]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    dtype: DType
    #: "in" buffers are read, "out" written, "inout" both (a kernel writing in place)
    role: str


@dataclass(frozen=True)
class LoopFunc:
    name: str
    buffers: tuple[Param, ...]
    #: size symbols the body uses, in order (kernel arguments)
    sizes: tuple[sympy.Symbol, ...]
    #: scalar program arguments the body uses (name, dtype)
    args: tuple[tuple[str, DType], ...]
    body: tuple[Stmt, ...]

    @property
    def text(self) -> str:
        return print_func(self)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __str__(self) -> str:
        return self.text


def _stmt_lines(s: Stmt, indent: str) -> list[str]:
    if isinstance(s, Loop):
        red = ""
        if s.reduces:
            red = " reduce(" + ", ".join(f"{k}: {n}" for n, k in s.reduces) + ")"
        work = f" if work >= {dim_str(s.work)}" if s.work is not None else ""
        head = f"{indent}{s.kind} {s.var} in [{dim_str(s.start)}, {dim_str(s.extent)}){red}{work} {{"
        lines = [head]
        for b in s.body:
            lines.extend(_stmt_lines(b, indent + "  "))
        lines.append(indent + "}")
        return lines
    if isinstance(s, Scratch):
        lines = [f"{indent}scratch %{s.name}: {s.dtype.value}[{dim_str(s.extent)}] {{"]
        for b in s.body:
            lines.extend(_stmt_lines(b, indent + "  "))
        lines.append(indent + "}")
        return lines
    if isinstance(s, Let):
        kw = "var" if s.mutable else "let"
        return [f"{indent}{kw} {s.name}: {s.dtype.value} = {expr_str(s.expr)}"]
    if isinstance(s, Accumulate):
        return [f"{indent}{s.name} {s.kind}= {expr_str(s.expr)}"]
    if isinstance(s, Prefetch):
        return [
            f"{indent}prefetch %{s.buf}[{sexpr(s.offset)} : +{dim_str(s.extent)}]"
            f" if {s.var} + 1 < {dim_str(s.limit)}"
        ]
    return [f"{indent}%{s.buf}[{sexpr(s.offset)}] = {expr_str(s.expr)}"]


def print_func(f: LoopFunc) -> str:
    params = [f"{p.role} %{p.name}: {p.dtype.value}*" for p in f.buffers]
    params += [f"{s}: i64" for s in f.sizes]
    params += [f"${n}: {d.value}" for n, d in f.args]
    lines = [f"func {f.name}({', '.join(params)}) {{"]
    for s in f.body:
        lines.extend(_stmt_lines(s, "  "))
    lines.append("}")
    return "\n".join(lines)
