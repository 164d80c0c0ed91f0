"""Lowering rules: each primitive Graph IR op as a composition of scalar expressions.

A rule is ``rule(lowering, node, *operands) -> value | [values]`` where operands
and values are :class:`~cuvil_ir.tensor_ir.values.Lazy` tensors or scalar
expressions. Raising :class:`~cuvil_ir.tensor_ir.values.NotLowered` makes the node
an extern call. A composite op (gelu, softmax, layer_norm ...) has no rule here: it
is lowered from its decomposition (:mod:`cuvil_ir.graph_ir.decompose`), its
primitives composed into one expression exactly as a rule would (see
:class:`_Rules`). Ops with neither (matmul, conv, embedding ...) are externs; their
declarations say why (``extern_reasons``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import sympy

from cuvil_ir.graph_ir.decompose import NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.ops.index import slice_bounds
from cuvil_ir.graph_ir.registry import REGISTRY, registrar
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarType, TensorType, promote_types
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import contiguous_strides
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx, linear_offset, strided_view

if TYPE_CHECKING:  # annotations only: lower imports this module
    from cuvil_ir.tensor_ir.lower import Lowering

Rule = Callable[..., Any]


class _Rules(dict[str, Rule]):
    """Op name -> rule; ``get`` answers for a composite op without a rule of its own
    with :func:`lower_decomposed`, so lowering needs no table of composite ops."""

    def get(self, name: str, default: Any = None) -> Any:
        found = super().get(name)
        if found is None and uses_decomposition(name, "tensor_ir", native=False):
            return lower_decomposed
        return found if found is not None else default

    @staticmethod
    def native(lw: Lowering, n: Node, *operands: Val) -> Lazy:
        """A composite op's native lowering for the target (its ``lower_<policy.native>``
        attribute): one call of the expression over the broadcast operands and the
        attributes, in the result's dtype (see [Note: native calls] in
        :mod:`cuvil_ir.tensor_ir.expr`)."""
        t = out_type(n)
        name = n.op.replace("::", "__") + "__" + t.dtype.value
        body = str(n.attr(f"lower_{lw.policy.native}"))
        decl = REGISTRY.get(n.op)
        operand_names = tuple(getattr(decl, "operands", ()))
        attrs = [a for a in decl.attr_names if not a.startswith("lower_")]
        if len(n.outputs) != 1 or len(operand_names) != len(operands):
            raise NotLowered(f"{n.op}: a native lowering takes its operands and makes one result")
        for v in operands:
            if isinstance(v, Lazy) and (
                v.rank > len(t.shape)
                or any(
                    d != 1 and sympy.expand(sympy.sympify(d) - sympy.sympify(o)) != 0
                    for d, o in zip(v.shape, t.shape[len(t.shape) - v.rank :])
                )
            ):
                raise NotLowered(
                    f"{n.op}: a native lowering is elementwise, its operands broadcast to its result"
                )
        consts = [const(n.attr(a), t.dtype) for a in attrs]
        params = (*operand_names, *attrs)
        return pointwise(
            n,
            lambda *xs: E.native_call(name, params, body, (*xs, *consts), t.dtype),
            *operands,
            compute=t.dtype,
        )


RULES: dict[str, Rule] = _Rules()

rule = registrar(RULES)


def lower_decomposed(lw: Lowering, n: Node, *operands: Val) -> list[Val]:
    """A composite op lowered from its decomposition: each primitive's rule composes
    onto its operands' expressions, and nothing in between is realized, so the result
    is one expression -- fused as if one rule had written it (softmax and layer norm
    stay one kernel per row). Any primitive that cannot be lowered here (a dtype or op
    the policy keeps out of kernels, no rule) makes the whole node one extern call."""
    try:
        ex = expand(n, lw.assumptions)
    except NotDecomposed as e:
        raise NotLowered(str(e)) from None
    env: dict[str, Val] = {v.name: x for v, x in zip(n.inputs, operands)}
    policy = lw.policy
    steps, buffers = len(lw.steps), dict(lw.buffers)  # a primitive's rule may realize
    try:
        for m in ex.nodes:
            kinds = [v.type.dtype for v in (*m.inputs, *m.outputs) if isinstance(v.type, TensorType)]
            r = RULES.get(m.op)
            if r is None or m.op in policy.extern_ops or any(d not in policy.dtypes for d in kinds):
                raise NotLowered(f"{n.op}: its primitive {m.op} is not lowered")
            res = r(lw, m, *(env[v.name] for v in m.inputs))
            for v, val in zip(m.outputs, res if isinstance(res, (list, tuple)) else [res]):
                env[v.name] = val
    except NotLowered:
        del lw.steps[steps:]  # the node becomes one extern: no kernel of a partial attempt stays
        lw.buffers = buffers
        raise
    return [env[v.name] for v in ex.outputs]


# -- helpers ------------------------------------------------------------------------
def out_type(n: Node, k: int = 0) -> TensorType:
    t = n.outputs[k].type
    assert isinstance(t, TensorType)
    return t


def _num(n: Node, name: str) -> float:
    v: Any = n.attr(name)
    return float(v)


def _ints(n: Node, name: str) -> tuple[int, ...]:
    v: Any = n.attr(name)
    return tuple(int(x) for x in v)


def const(value: Any, dtype: DType) -> E.Const:
    if dtype == DType.bool:
        return E.Const(bool(value), dtype)
    if dtype.is_floating:
        return E.Const(float(value), dtype)
    return E.Const(int(value), dtype)


def cast(e: E.Expr, dtype: DType) -> E.Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, E.Const) and not (
        isinstance(e.value, float) and not math.isfinite(e.value) and not dtype.is_floating
    ):
        return const(e.value, dtype)
    return E.Call("cast", (e,), dtype)


def call(fn: str, *args: E.Expr, dtype: DType | None = None) -> E.Expr:
    return E.Call(fn, tuple(args), dtype or args[0].dtype)


def element(v: Val, out_shape: Sequence[Dim], index: Sequence[Any] | None = None) -> E.Expr:
    """``v`` broadcast to ``out_shape`` (numpy rules), at ``index`` (default: ``_i0 ...``)."""
    if not isinstance(v, Lazy):
        return v
    index = list(index if index is not None else idx(len(out_shape)))
    lead = len(out_shape) - v.rank
    sub = []
    for d in range(v.rank):
        od = out_shape[lead + d]
        if v.shape[d] == 1 and od != 1:
            sub.append(sympy.Integer(0))
        else:
            sub.append(index[lead + d])
    return v.at(sub)


def pointwise(n: Node, fn: Callable[..., E.Expr], *vals: Val, compute: DType | None = None) -> Lazy:
    t = out_type(n)
    args = [element(v, t.shape) for v in vals]
    if compute is not None:
        args = [cast(a, compute) for a in args]
    return Lazy(t.shape, t.dtype, cast(fn(*args), t.dtype))


def compute_dtype(n: Node) -> DType:
    """The dtype torch computes a comparison in (promotion of its operands)."""
    return promote_types(*(v.type for v in n.inputs))


def norm_dims(dims: Any, rank: int) -> tuple[int, ...]:
    if dims is None or dims == ():
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({d % max(rank, 1) for d in dims}))


def reduce(
    lw: Lowering,
    kind: str,
    x: Lazy,
    dims: Sequence[int],
    body: Callable[[E.Expr], E.Expr] | None = None,
    out_index: Sequence[Any] | None = None,
    keep: bool = True,
    dtype: DType | None = None,
) -> E.Expr:
    """``kind`` over ``dims`` of ``x`` at the kept-dims index ``out_index``.

    ``out_index`` lists one index per dim of ``x`` when ``keep`` (reduced dims'
    entries are ignored), else one per kept dim.
    """
    rsyms = {d: lw.reduce_symbol() for d in dims}
    out_index = list(out_index if out_index is not None else idx(x.rank if keep else x.rank - len(dims)))
    full: list[Any] = []
    k = 0
    for d in range(x.rank):
        if d in rsyms:
            full.append(rsyms[d])
            if keep:
                k += 1
        else:
            full.append(out_index[k])
            k += 1
    e = x.at(full)
    if dtype is not None:
        e = cast(e, dtype)
    if body is not None:
        e = body(e)
    return E.make_reduce(kind, e, tuple((rsyms[d], sympy.sympify(x.shape[d])) for d in dims), e.dtype)


def count(x: Lazy, dims: Sequence[int], dtype: DType) -> E.Expr:
    n: Any = sympy.Integer(1)
    for d in dims:
        n = n * x.shape[d]
    n = sympy.expand(n)
    return const(int(n), dtype) if n.is_Integer else cast(E.Index(n, DType.i64), dtype)


def tensor_operand(v: Val) -> Lazy:
    if not isinstance(v, Lazy):
        raise NotLowered("scalar where a tensor was expected")
    return v


# -- elementwise --------------------------------------------------------------------
#: op -> scalar function, for the unary ops that are one function of their operand
_UNARY = {
    **{f: f for f in "neg abs exp expm1 log log1p log2 sqrt rsqrt sin cos tan atan tanh erf sigmoid".split()},
    **{"reciprocal": "reciprocal", "sign": "sign", "bitwise_not": "bitnot"},
}
_ROUNDING = {"floor": "floor", "ceil": "ceil", "trunc": "trunc"}
_BINARY = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "maximum": "max",
    "minimum": "min",
    "atan2": "atan2",
    "fmod": "fmod",
    "remainder": "mod",
    "floor_divide": "floordiv",
    "bitwise_and": "bitand",
    "bitwise_or": "bitor",
    "bitwise_xor": "bitxor",
}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_LOGICAL = {"logical_and": "and", "logical_or": "or", "logical_xor": "xor"}


def _unary(fn: str) -> Rule:
    def lower_unary(lw: Lowering, n: Node, x: Val) -> Lazy:
        t = out_type(n)
        if fn == "bitnot" and t.dtype == DType.bool:
            return pointwise(n, lambda a: call("not", a), x, compute=DType.bool)
        return pointwise(n, lambda a: call(fn, a), x, compute=t.dtype)

    return lower_unary


for _name, _fn in _UNARY.items():
    rule(_name)(_unary(_fn))


@rule(*_ROUNDING)
def _rounding(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    if not t.dtype.is_floating:
        return pointwise(n, lambda a: a, x, compute=t.dtype)
    return pointwise(n, lambda a: call(_ROUNDING[n.op], a), x, compute=t.dtype)


@rule("round")
def _round(lw: Lowering, n: Node, x: Val) -> Lazy:
    if n.attr("decimals", 0) != 0:
        raise NotLowered("round with decimals")
    t = out_type(n)
    if not t.dtype.is_floating:
        return pointwise(n, lambda a: a, x, compute=t.dtype)
    return pointwise(n, lambda a: call("round", a), x, compute=t.dtype)


def float_floordiv(a: E.Expr, b: E.Expr) -> E.Expr:
    """Float ``a // b`` exactly as eager computes it (ATen's ``div_floor_floating``):
    through ``fmod``, not ``floor(a / b)``, so ``inf // 2`` is nan, ``-1 // inf`` is -1
    and a zero quotient keeps the sign of ``a / b``."""
    dt = a.dtype
    zero, one = const(0.0, dt), const(1.0, dt)
    quotient = call("div", a, b)
    mod = call("fmod", a, b)
    div = call("div", call("sub", a, mod), b)
    # a nonzero remainder whose sign differs from b's: the truncated quotient is one too high
    differs = call("xor", call("lt", b, zero, dtype=DType.bool), call("lt", mod, zero, dtype=DType.bool))
    adjust = call("and", call("ne", mod, zero, dtype=DType.bool), differs)
    div = call("where", adjust, call("sub", div, one), div, dtype=dt)
    floor = call("floor", div)
    up = call("gt", call("sub", div, floor), const(0.5, dt), dtype=DType.bool)
    floor = call("where", up, call("add", floor, one), floor, dtype=dt)
    # copysign(0, a / b): the quotient is finite here, and 0 * q carries its sign (no -ffast-math)
    signed_zero = call("mul", quotient, zero)
    result = call("where", call("ne", div, zero, dtype=DType.bool), floor, signed_zero, dtype=dt)
    return call("where", call("eq", b, zero, dtype=DType.bool), quotient, result, dtype=dt)


def _binary(fn: str) -> Rule:
    def lower_binary(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
        t = out_type(n)
        if fn == "floordiv" and t.dtype.is_floating:
            return pointwise(n, float_floordiv, a, b, compute=t.dtype)
        return pointwise(n, lambda x, y: call(fn, x, y), a, b, compute=t.dtype)

    return lower_binary


for _name, _fn in _BINARY.items():
    rule(_name)(_binary(_fn))


@rule(*_COMPARE)
def _compare(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
    c = compute_dtype(n)
    return pointwise(n, lambda x, y: call(_COMPARE[n.op], x, y, dtype=DType.bool), a, b, compute=c)


@rule(*_LOGICAL)
def _logical(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
    return pointwise(n, lambda x, y: call(_LOGICAL[n.op], x, y, dtype=DType.bool), a, b, compute=DType.bool)


@rule("logical_not")
def _logical_not(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: call("not", a, dtype=DType.bool), x, compute=DType.bool)


@rule("where")
def _where(lw: Lowering, n: Node, c: Val, a: Val, b: Val) -> Lazy:
    t = out_type(n)
    return Lazy(
        t.shape,
        t.dtype,
        E.Call(
            "where",
            (
                cast(element(c, t.shape), DType.bool),
                cast(element(a, t.shape), t.dtype),
                cast(element(b, t.shape), t.dtype),
            ),
            t.dtype,
        ),
    )


@rule("pow")
def _pow(lw: Lowering, n: Node, a: Val, b: Val) -> Lazy:
    t = out_type(n)
    if isinstance(b, E.Const) and t.dtype.is_floating:
        e = b.value
        if e == 2:
            return pointwise(n, lambda x: call("mul", x, x), a, compute=t.dtype)
        if e == 3:
            return pointwise(n, lambda x: call("mul", call("mul", x, x), x), a, compute=t.dtype)
        if e == 1:
            return pointwise(n, lambda x: x, a, compute=t.dtype)
        if e == 0.5:
            return pointwise(n, lambda x: call("sqrt", x), a, compute=t.dtype)
        if e == -1:
            return pointwise(n, lambda x: call("reciprocal", x), a, compute=t.dtype)
    if not t.dtype.is_floating:
        raise NotLowered("integer pow")
    return pointwise(n, lambda x, y: call("pow", x, y), a, b, compute=t.dtype)


@rule("square")
def _square(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: call("mul", a, a), x, compute=out_type(n).dtype)


@rule("cast")
def _cast(lw: Lowering, n: Node, x: Val) -> Lazy:
    return pointwise(n, lambda a: a, x)


@rule("clamp")
def _clamp(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    lo, hi = n.attr("min"), n.attr("max")

    def f(a: E.Expr) -> E.Expr:
        if lo is not None:
            a = call("max", a, const(lo, t.dtype))
        if hi is not None:
            a = call("min", a, const(hi, t.dtype))
        return a

    return pointwise(n, f, x, compute=t.dtype)


# -- activations: relu is a primitive; the others lower from their decompositions ----------
@rule("relu")
def _relu(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    # max propagates NaN, as torch's relu does
    return pointwise(n, lambda a: call("max", a, const(0, t.dtype)), x, compute=t.dtype)


@rule("tril", "triu")
def _triangle(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    diag = n.attr("diagonal")
    i, j = idx(t.rank)[-2:]
    offset = sympy.sympify(j - i - diag)  # tril keeps j - i <= diagonal
    keep = E.Call(
        "le" if n.op == "tril" else "ge", (E.Index(offset, DType.i64), const(0, DType.i64)), DType.bool
    )
    return Lazy(t.shape, t.dtype, E.Call("where", (keep, element(x, t.shape), const(0, t.dtype)), t.dtype))


# -- factories and constants ----------------------------------------------------------
@rule("const")
def _const(lw: Lowering, n: Node) -> E.Expr:
    v = n.attr("value")
    t = n.outputs[0].type
    if isinstance(t, TensorType):
        raise NotLowered("tensor constant")
    assert isinstance(t, ScalarType)
    dtype = SCALAR_DTYPES[t.kind]
    if isinstance(v, sympy.Basic):
        if not v.is_number:
            if isinstance(v, (sympy.Rel, sympy.logic.boolalg.Boolean)) and not isinstance(v, sympy.Symbol):
                raise NotLowered("size predicate")
            return E.Index(v, dtype)
        v = bool(v) if dtype == DType.bool else (float(v) if dtype.is_floating else int(v))
    if not isinstance(v, (bool, int, float)):
        raise NotLowered(f"constant {v!r}")
    return const(v, dtype)


@rule("full")
def _full(lw: Lowering, n: Node) -> Lazy:
    t = out_type(n)
    v = n.attr("value")
    if not isinstance(v, (bool, int, float)):
        raise NotLowered("symbolic fill value")
    return Lazy(t.shape, t.dtype, const(v, t.dtype))


@rule("arange")
def _arange(lw: Lowering, n: Node) -> Lazy:
    t = out_type(n)
    start, step = n.attr("start"), n.attr("step")
    if not all(isinstance(v, (int, float, sympy.Basic)) for v in (start, step)):
        raise NotLowered("arange bounds")
    if t.dtype.is_floating and (isinstance(start, float) or isinstance(step, float)):
        body: E.Expr = call(
            "add",
            const(float(start), DType.f64),  # type: ignore[arg-type]
            call("mul", cast(E.Index(idx(1)[0], DType.i64), DType.f64), const(float(step), DType.f64)),  # type: ignore[arg-type]
        )
        return Lazy(t.shape, t.dtype, cast(body, t.dtype))
    if isinstance(start, float) or isinstance(step, float):
        raise NotLowered("float arange into an integer tensor")
    return Lazy(t.shape, t.dtype, cast(E.Index(sympy.sympify(start) + idx(1)[0] * step, DType.i64), t.dtype))


# -- views ----------------------------------------------------------------------------
@rule("permute")
def _permute(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    perm = [int(p) for p in _ints(n, "perm")]
    t = out_type(n)
    src: list[Any] = [0] * x.rank
    for j, p in enumerate(perm):
        src[p] = idx(t.rank)[j]
    return Lazy(t.shape, t.dtype, x.at(src))


@rule("expand")
def _expand(lw: Lowering, n: Node, x: Val) -> Lazy:
    t = out_type(n)
    return Lazy(t.shape, t.dtype, element(x, t.shape))


@rule("unsqueeze")
def _unsqueeze(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    d = int(n.attr("dim")) % t.rank  # type: ignore[arg-type]
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at(i[:d] + i[d + 1 :]))


@rule("squeeze")
def _squeeze(lw: Lowering, n: Node, x: Val) -> Lazy:
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
def _slice(lw: Lowering, n: Node, x: Val) -> Lazy:
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
def _select(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    d = int(n.attr("dim")) % x.rank  # type: ignore[arg-type]
    index = _norm_index(n.attr("index"), x.shape[d], 0)
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at(i[:d] + [sympy.sympify(index)] + i[d:]))


@rule("flip")
def _flip(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    i = idx(t.rank)
    return Lazy(t.shape, t.dtype, x.at([x.shape[d] - 1 - i[d] if d in dims else i[d] for d in range(x.rank)]))


@rule("reshape")
def _reshape(lw: Lowering, n: Node, x: Val) -> Lazy:
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
def _split(lw: Lowering, n: Node, x: Val) -> list[Lazy]:
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
def _cat(lw: Lowering, n: Node, *xs: Val) -> Lazy:
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
def _pad(lw: Lowering, n: Node, x: Val) -> Lazy:
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
def _repeat(lw: Lowering, n: Node, x: Val) -> Lazy:
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


# -- reductions -----------------------------------------------------------------------
_REDUCE = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "any": "any", "all": "all"}


@rule(*_REDUCE)
def _reduction(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    if x.rank == 0:
        return Lazy(t.shape, t.dtype, cast(x.body, t.dtype))
    keep = bool(n.attr("keepdim"))
    kind = _REDUCE[n.op]
    dt = DType.bool if kind in ("any", "all") else t.dtype
    body = reduce(lw, kind, x, dims, keep=keep, dtype=dt)
    return Lazy(t.shape, t.dtype, cast(body, t.dtype))


@rule("mean")
def _mean(lw: Lowering, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    if x.rank == 0:
        return Lazy(t.shape, t.dtype, cast(x.body, t.dtype))
    s = reduce(lw, "sum", x, dims, keep=bool(n.attr("keepdim")), dtype=t.dtype)
    return Lazy(t.shape, t.dtype, call("div", s, count(x, dims, t.dtype)))


@rule("dropout")
def _dropout(lw: Lowering, n: Node, x: Val) -> Lazy:
    """Train-mode dropout with a counter-based RNG: element ``i`` is kept when
    ``rand(seed, i) >= p``. ``seed`` is drawn from torch's generator once per call,
    so ``torch.manual_seed`` makes runs reproducible, and the mask does not depend
    on the schedule: dropout fuses into whatever kernel consumes it."""
    x = tensor_operand(x)
    t = out_type(n)
    p = float(_num(n, "p"))
    if p >= 1.0:
        return Lazy(t.shape, t.dtype, const(0, t.dtype))
    seed = lw.seed()
    counter = E.Index(linear_offset(x.shape, idx(x.rank)), DType.i64)
    keep = call("ge", E.Call("rand", (seed, counter), DType.f32), const(p, DType.f32), dtype=DType.bool)
    scaled = call("mul", cast(x.body, t.dtype), const(1.0 / (1.0 - p), t.dtype))
    return Lazy(t.shape, t.dtype, E.Call("where", (keep, scaled, const(0, t.dtype)), t.dtype))


@rule("interpolate")
def _interpolate(lw: Lowering, n: Node, x: Val) -> Lazy:
    """Nearest-neighbour resizing by power-of-two factors, as an index map.

    torch picks source ``floor(i * (1 / scale))`` in float; for a power-of-two
    factor that product is exact, so the integer map ``i // f`` (upsampling by f)
    or ``i * f`` (downsampling) gives the same elements. Other modes and factors
    run through torch.
    """
    x = tensor_operand(x)
    t = out_type(n)
    scales: Any = n.attr("scale_factor")
    if (
        n.attr("mode") != "nearest"
        or n.attr("antialias")
        or n.attr("recompute_scale_factor")
        or scales is None
        or len(scales) != x.rank - 2
    ):
        raise NotLowered("interpolate: only nearest by power-of-two scale factors is lowered")
    i = idx(t.rank)
    src: list[Any] = list(i[:2])
    for d, s in enumerate(scales):
        f = float(s)
        up, down = f >= 1, f < 1
        factor = f if up else 1 / f
        if factor != int(factor) or int(factor) & (int(factor) - 1):
            raise NotLowered("interpolate: scale factor not a power of two")
        k = int(factor)
        src.append(sympy.floor(i[2 + d] / k) if up else i[2 + d] * k)
        if down and x.shape[2 + d] == 0:
            raise NotLowered("interpolate of an empty dimension")
    return Lazy(t.shape, t.dtype, x.at(src))
