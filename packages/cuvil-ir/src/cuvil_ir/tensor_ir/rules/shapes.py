"""Rules of the view, slicing and joining ops: each is an index map onto its operand
(``permute``, ``expand``, ``squeeze``, ``slice``, ``select``, ``flip``, ``split``,
``repeat``), a choice between operands by position (``cat``, ``pad``), or, for
``reshape``, a strided view when the strides allow one (else a copy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.ops.index import slice_bounds
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.program import contiguous_strides
from cuvil_ir.tensor_ir.rules.helpers import (
    cast,
    const,
    element,
    ints_attr,
    norm_dims,
    out_type,
    tensor_operand,
)
from cuvil_ir.tensor_ir.rules.table import rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx, strided_view


# -- views ----------------------------------------------------------------------------
@rule("permute")
def _permute(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    perm = [int(p) for p in ints_attr(n, "perm")]
    t = out_type(n)
    src: list[Any] = [0] * x.rank
    for j, p in enumerate(perm):
        src[p] = idx(t.rank)[j]
    return Lazy(t.shape, t.dtype, x.at(src))


@rule("expand")
def _expand(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    return Lazy(t.shape, t.dtype, element(x, t.shape))


@rule("unsqueeze")
def _unsqueeze(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    d = int(n.attr("dim")) % t.rank  # type: ignore[arg-type]
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at(i[:d] + i[d + 1 :]))


@rule("squeeze")
def _squeeze(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    gone = {d for d in dims if x.shape[d] == 1}
    if len(gone) != x.rank - t.rank:
        raise NotLowered("squeeze of a dimension whose size is not known to be 1")
    i = iter(idx(t.rank))
    return Lazy(t.shape, t.dtype, x.at([0 if d in gone else next(i) for d in range(x.rank)]))


def _norm_index(v: Any, size: Dim, default: Any) -> Any:
    if v is None:
        return default
    if isinstance(v, int) and v < 0:
        return size + v
    return v


@rule("slice")
def _slice(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    d = int(n.attr("dim")) % x.rank  # type: ignore[arg-type]
    # torch's normalisation (wrap a negative start once, clamp into [0, size]), decided
    # under the graph's assumptions as the shape rule decided it: `x[-3:]` of a dim
    # known shorter than 3 starts at 0, not at `x_0 - 3`
    try:
        start, _ = slice_bounds(
            ShapeContext(None, lw.assumptions),
            x.shape[d],
            n.attr("start"),
            n.attr("end"),
        )
    except UndecidableError:
        raise NotLowered("slice bounds the graph's assumptions do not decide") from None
    step = int(n.attr("step"))  # type: ignore[arg-type]
    i = idx(t.rank)
    src = list(i)
    src[d] = sympy.sympify(start) + i[d] * step
    return Lazy(t.shape, t.dtype, x.at(src))


@rule("select")
def _select(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    d = int(n.attr("dim")) % x.rank  # type: ignore[arg-type]
    index = _norm_index(n.attr("index"), x.shape[d], 0)
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at(i[:d] + [sympy.sympify(index)] + i[d:]))


@rule("flip")
def _flip(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at([x.shape[d] - 1 - i[d] if d in dims else i[d] for d in range(x.rank)]))


@rule("reshape")
def _reshape(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    sv = strided_view(x)
    strides = view_strides(x.shape, sv[1], t.shape) if sv is not None else None
    if sv is not None and strides is None and _is_contiguous(x.shape, sv[1]):
        strides = list(contiguous_strides(tuple(t.shape)))  # sizes the view rule cannot compare
    if sv is None or strides is None:
        x = lw.realize(x)
        sv = strided_view(x)
        assert sv is not None
        strides = list(contiguous_strides(tuple(t.shape)))
    buf, _, base = sv
    off: Any = sympy.sympify(base)
    for i, st in zip(idx(t.rank), strides):
        off = off + i * st
    return Lazy(t.shape, t.dtype, E.Load(buf, sympy.expand(off), t.dtype))


def _same(a: Any, b: Any) -> bool:
    return bool(sympy.expand(sympy.sympify(a) - b) == 0)


def view_strides(shape: Sequence[Dim], strides: Sequence[Dim], new: Sequence[Dim]) -> list[Any] | None:
    """Strides of ``new`` viewing a tensor of ``shape``/``strides`` without a copy, or None.

    torch's ``computeStride``: each run of old dims that are contiguous with each
    other may be re-split into new dims of the same total size. Sizes are
    compared symbolically; an undecidable comparison means "copy".
    """
    if not shape:
        return [1] * len(new)
    out: list[Any] = [0] * len(new)
    view_d = len(new) - 1
    chunk = sympy.sympify(strides[-1])
    tensor_n: Any = sympy.Integer(1)
    view_n: Any = sympy.Integer(1)
    for d in range(len(shape) - 1, -1, -1):
        tensor_n = tensor_n * shape[d]
        if d == 0 or (shape[d - 1] != 1 and not _same(strides[d - 1], tensor_n * chunk)):
            # consume new dims until their product is this chunk's (structurally equal)
            while view_d >= 0 and (not _same(view_n, tensor_n) or new[view_d] == 1):
                out[view_d] = sympy.expand(view_n * chunk)
                view_n = view_n * new[view_d]
                view_d -= 1
            if not _same(view_n, tensor_n):
                return None
            if d > 0:
                chunk = sympy.sympify(strides[d - 1])
                tensor_n = sympy.Integer(1)
                view_n = sympy.Integer(1)
    if view_d != -1:
        return None
    return out


def _is_contiguous(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    expected = contiguous_strides(tuple(shape))
    return all(d == 1 or sympy.expand(s - c) == 0 for d, s, c in zip(shape, strides, expected))


@rule("split")
def _split(lw: LoweringContext, n: Node, x: Val) -> list[Lazy]:
    x = tensor_operand(x)
    d = int(n.attr("dim")) % x.rank  # type: ignore[arg-type]
    outs = []
    start: Any = 0
    for k in range(len(n.outputs)):
        t = out_type(n, k)
        i = idx(t.rank)
        src = list(i)
        src[d] = i[d] + start
        outs.append(Lazy(t.shape, t.dtype, x.at(src)))
        start = start + t.shape[d]
    return outs


@rule("cat")
def _cat(lw: LoweringContext, n: Node, *xs: Val) -> Lazy:
    t = out_type(n)
    d = int(n.attr("dim")) % t.rank  # type: ignore[arg-type]
    parts = [tensor_operand(x) for x in xs]
    parts = [p for p in parts if not (p.rank == 1 and p.shape[0] == 0)]
    i = idx(t.rank)
    starts: list[Any] = []
    acc: Any = 0
    for p in parts:
        starts.append(acc)
        acc = acc + p.shape[d]
    body: E.Expr | None = None
    for p, s in reversed(list(zip(parts, starts))):
        src = list(i)
        src[d] = i[d] - s
        val = cast(p.at(src), t.dtype)
        if body is None:
            body = val
        else:
            cond = E.Call(
                "lt",
                (E.Index(i[d], DType.i64), E.Index(sympy.sympify(s + p.shape[d]), DType.i64)),
                DType.bool,
            )
            body = E.Call("where", (cond, val, body), t.dtype)
    if body is None:
        raise NotLowered("empty cat")
    return Lazy(t.shape, t.dtype, body)


@rule("pad")
def _pad(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    if n.attr("mode") != "constant":
        raise NotLowered("non-constant padding")
    x = tensor_operand(x)
    t = out_type(n)
    pad = list(n.attr("pad"))  # type: ignore[arg-type]
    value = n.attr("value") or 0
    i = idx(t.rank)
    src = list(i)
    conds = []
    for k in range(len(pad) // 2):
        d = t.rank - 1 - k
        left = pad[2 * k]
        if isinstance(left, int) and left < 0 or isinstance(pad[2 * k + 1], int) and pad[2 * k + 1] < 0:
            raise NotLowered("negative padding")
        src[d] = i[d] - left
        if left != 0:
            conds.append(
                E.Call("ge", (E.Index(i[d], DType.i64), E.Index(sympy.sympify(left), DType.i64)), DType.bool)
            )
        conds.append(
            E.Call(
                "lt",
                (E.Index(i[d] - left, DType.i64), E.Index(sympy.sympify(x.shape[d]), DType.i64)),
                DType.bool,
            )
        )
    inside: E.Expr = conds[0]
    for c in conds[1:]:
        inside = E.Call("and", (inside, c), DType.bool)
    return Lazy(t.shape, t.dtype, E.Call("where", (inside, x.at(src), const(value, t.dtype)), t.dtype))


@rule("repeat")
def _repeat(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    i = idx(t.rank)
    lead = t.rank - x.rank
    # a dim of size 0 repeats to size 0: no index is ever read, but Mod(i, 0) is not even
    # an expression (sympy raises), so it reads index 0 "instead"
    src = [
        sympy.Integer(0) if x.shape[d] in (0, 1) else sympy.Mod(i[lead + d], x.shape[d])
        for d in range(x.rank)
    ]
    return Lazy(t.shape, t.dtype, x.at(src))
