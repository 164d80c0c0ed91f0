"""Decompositions: a composite op's math written once, as primitive Graph IR ops.

An op declaration may carry ``decompose(b, *inputs, **attrs)``: given a
:class:`Builder` and its inputs as :class:`Sym` handles, it returns its result(s)
built from other registered ops (``0.5 * x * (1 + (x * sqrt(0.5)).erf())``). The
consumers -- Tensor IR lowering, MLIR emission, ONNX export -- implement the
primitives and, optionally, a native fast path for the composite; an op they have
no native form for is expanded with :func:`expand` and its primitives are lowered
in its place (see docs/ops.md). So the math lives at the declaration, beside the
op's torch reference, which stays the independent oracle the tests compare with.

Low-precision floats compute in float32 inside a decomposition, as eager torch
does: :func:`expand` casts f16/bf16 tensor inputs to f32 before calling it and its
results back to the declared output types, so a fused kernel rounds once, not
after every primitive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import AttrValue, Block, Loc, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types
from cuvil_ir.graph_ir.types import DType, ScalarType, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError, canonical, prove, with_equalities

#: ``decompose(b, *inputs, **attrs) -> Sym | tuple[Sym, ...]``
Decomposition = Callable[..., Any]

#: the float types a decomposition never computes in (it upcasts them to f32)
LOW_PRECISION = frozenset({DType.f16, DType.bf16})


class NotDecomposed(Exception):
    """This node's decomposition does not apply (an attribute it does not cover, a
    shape fact it cannot decide); the consumer falls back as for an op without one."""


class Sym:
    """A value inside a decomposition; arithmetic records primitive ops.

    Python numbers mix in as weak scalars (``const`` nodes), with torch's promotion,
    in the order written: ``2 * x`` records ``mul(2, x)``.
    """

    __slots__ = ("b", "value")

    def __init__(self, b: Builder, value: Value) -> None:
        self.b = b
        self.value = value

    @property
    def type(self) -> Type:
        return self.value.type

    @property
    def tensor(self) -> TensorType:
        t = self.value.type
        if not isinstance(t, TensorType):
            raise NotDecomposed(f"expected a tensor, got {t}")
        return t

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.tensor.shape

    @property
    def rank(self) -> int:
        return self.tensor.rank

    # -- arithmetic (binary ops broadcast and promote as torch does) ----------------------
    def __add__(self, o: Any) -> Sym:
        return self.b.op("add", self, o)

    def __radd__(self, o: Any) -> Sym:
        return self.b.op("add", o, self)

    def __sub__(self, o: Any) -> Sym:
        return self.b.op("sub", self, o)

    def __rsub__(self, o: Any) -> Sym:
        return self.b.op("sub", o, self)

    def __mul__(self, o: Any) -> Sym:
        return self.b.op("mul", self, o)

    def __rmul__(self, o: Any) -> Sym:
        return self.b.op("mul", o, self)

    def __truediv__(self, o: Any) -> Sym:
        return self.b.op("div", self, o)

    def __rtruediv__(self, o: Any) -> Sym:
        return self.b.op("div", o, self)

    def __neg__(self) -> Sym:
        return self.b.op("neg", self)

    def __gt__(self, o: Any) -> Sym:
        return self.b.op("gt", self, o)

    def __lt__(self, o: Any) -> Sym:
        return self.b.op("lt", self, o)

    def __ge__(self, o: Any) -> Sym:
        return self.b.op("ge", self, o)

    def __le__(self, o: Any) -> Sym:
        return self.b.op("le", self, o)

    def eq(self, o: Any) -> Sym:  # not __eq__: handles stay hashable and comparable
        return self.b.op("eq", self, o)

    def maximum(self, o: Sym) -> Sym:
        return self.b.op("maximum", self, o)

    def minimum(self, o: Sym) -> Sym:
        return self.b.op("minimum", self, o)

    def clamp(self, min: float | None = None, max: float | None = None) -> Sym:
        return self.b.op("clamp", self, min=min, max=max)

    # -- unary math -------------------------------------------------------------------------
    def exp(self) -> Sym:
        return self.b.op("exp", self)

    def expm1(self) -> Sym:
        return self.b.op("expm1", self)

    def log(self) -> Sym:
        return self.b.op("log", self)

    def log1p(self) -> Sym:
        return self.b.op("log1p", self)

    def erf(self) -> Sym:
        return self.b.op("erf", self)

    def tanh(self) -> Sym:
        return self.b.op("tanh", self)

    def sigmoid(self) -> Sym:
        return self.b.op("sigmoid", self)

    def abs(self) -> Sym:
        return self.b.op("abs", self)

    def sqrt(self) -> Sym:
        return self.b.op("sqrt", self)

    def rsqrt(self) -> Sym:
        return self.b.op("rsqrt", self)

    def relu(self) -> Sym:
        return self.b.op("relu", self)

    # -- reductions (``dims`` normalised, non-negative) ----------------------------------------
    def sum(self, dims: Sequence[int], keepdim: bool = False) -> Sym:
        return self.b.op("sum", self, dims=tuple(dims), keepdim=keepdim, dtype=None)

    def mean(self, dims: Sequence[int], keepdim: bool = False) -> Sym:
        return self.b.op("mean", self, dims=tuple(dims), keepdim=keepdim, dtype=None)

    def amax(self, dims: Sequence[int], keepdim: bool = False) -> Sym:
        return self.b.op("amax", self, dims=tuple(dims), keepdim=keepdim)

    # -- types and shapes ----------------------------------------------------------------------
    def cast(self, dtype: DType) -> Sym:
        return self if self.dtype == dtype else self.b.op("cast", self, dtype=dtype)

    def reshape(self, shape: Sequence[Dim]) -> Sym:
        return self.b.op("reshape", self, shape=tuple(shape))

    def unsqueeze(self, dim: int) -> Sym:
        return self.b.op("unsqueeze", self, dim=dim)

    def __repr__(self) -> str:
        return f"Sym({self.value.name}: {self.value.type})"


def where(cond: Sym, a: Sym | float, b: Sym | float) -> Sym:
    """``torch.where(cond, a, b)``."""
    return cond.b.op("where", cond, a, b)


class Builder:
    """Records the primitive nodes of one expansion.

    Output types come from each op's own shape rule under the graph's assumptions,
    without example sizes: a fact the assumptions do not settle makes the expansion
    fail (:class:`NotDecomposed`) rather than specialise the graph.
    """

    def __init__(self, node: Node, ctx: ShapeContext) -> None:
        self.node = node
        self.ctx = ctx
        self.nodes: list[Node] = []
        self._names = (f"{node.outputs[0].name if node.outputs else node.op}.d{i}" for i in itertools.count())

    @property
    def loc(self) -> Loc | None:
        return self.node.loc

    def out_type(self, k: int = 0) -> Type:
        """The declared type of the composite's ``k``-th output."""
        return self.node.outputs[k].type

    def op(self, name: str, *inputs: Sym | bool | int | float, **attrs: AttrValue) -> Sym:
        """Record ``name(*inputs) {attrs}`` (Python numbers become ``const`` nodes)."""
        outs = self.emit(name, inputs, attrs)
        if len(outs) != 1:
            raise NotDecomposed(f"{name} has {len(outs)} results")
        return outs[0]

    def emit(
        self, name: str, inputs: Sequence[Sym | bool | int | float], attrs: dict[str, AttrValue]
    ) -> list[Sym]:
        vals = tuple(self._operand(v) for v in inputs)
        try:
            types = infer_types(REGISTRY.get(name), self.ctx, [v.type for v in vals], attrs)
        except (ValueError, UndecidableError) as e:  # ShapeError is a ValueError
            raise NotDecomposed(f"{self.node.op}: {name}: {e}") from e
        outs = tuple(Value(next(self._names), t) for t in types)
        self.nodes.append(Node(name, vals, outs, tuple(sorted(attrs.items())), loc=self.loc))
        return [Sym(self, o) for o in outs]

    def const(self, value: bool | int | float | sympy.Basic) -> Sym:
        """A scalar operand: a number, or a size expression (``Max(x_1 - 1, 0)``)."""
        return self.op("const", value=value)

    def _operand(self, v: Sym | bool | int | float) -> Value:
        if isinstance(v, Sym):
            return v.value
        if isinstance(v, (bool, int, float)):
            return self.const(v).value
        raise TypeError(f"not an operand of a decomposition: {v!r}")

    def upcast(self, x: Sym) -> Sym:
        """``x`` in float32 when it is an f16/bf16 tensor (torch's "opmath" type)."""
        if isinstance(x.type, TensorType) and x.type.dtype in LOW_PRECISION:
            return x.cast(DType.f32)
        return x


@dataclass(frozen=True, slots=True)
class Expansion:
    """A node's decomposition: primitive ``nodes`` over the node's inputs, and the
    values standing for its outputs (of the declared types)."""

    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    #: size facts the expansion relies on beyond the graph's assumptions, which imply
    #: them (``Eq(c, 2*floor(c/2))`` from ``Eq(Mod(c, 2), 0)``)
    facts: tuple[sympy.Basic, ...] = ()


def decomposition(op: str) -> Decomposition | None:
    """The op's declared decomposition, if any."""
    return REGISTRY.get(op).decompose if op in REGISTRY else None


def uses_decomposition(op: str, consumer: str, native: bool) -> bool:
    """Whether ``consumer`` (``tensor_ir``, ``mlir``, ``onnx``) should expand ``op``: it has
    a decomposition, the consumer has no ``native`` form of it, and the declaration does
    not keep it from that consumer (``extern_reasons``)."""
    if native or op not in REGISTRY:
        return False
    decl = REGISTRY.get(op)
    return decl.decompose is not None and consumer not in decl.extern_reasons


def expand(
    node: Node, assumptions: Sequence[sympy.Basic] = (), decompose: Decomposition | None = None
) -> Expansion:
    """``node`` written in primitive ops (raises :class:`NotDecomposed` when its op has no
    decomposition or the decomposition does not apply to this node). A composite op's
    decomposition is its region (:mod:`cuvil_ir.graph_ir.ops.composite`), inlined.
    ``decompose`` replaces the op's declared decomposition (a consumer's fallback for a
    primitive it lacks, :mod:`cuvil_ir.graph_ir.fallbacks`)."""
    if decompose is None and node.op in REGISTRY and "composite" in REGISTRY.get(node.op).traits:
        return _inline(node)
    fn = decompose or decomposition(node.op)
    if fn is None:
        raise NotDecomposed(f"{node.op} has no decomposition")
    ctx = _Context(with_equalities(assumptions))
    b = Builder(node, ctx)
    ins = [b.upcast(Sym(b, v)) for v in node.inputs]
    res = fn(b, *ins, **node.attr_dict)
    results = res if isinstance(res, tuple) else (res,)
    if len(results) != len(node.outputs):
        raise NotDecomposed(f"{node.op}: the decomposition gives {len(results)} results")
    outs = []
    for r, want in zip(results, node.outputs):
        if isinstance(want.type, TensorType) and isinstance(r.type, TensorType):
            r = r.cast(want.type.dtype)
        if not _same_type(r.type, want.type):
            raise NotDecomposed(f"{node.op}: the decomposition gives {r.type}, the op {want.type}")
        outs.append(r.value)
    return Expansion(tuple(b.nodes), tuple(outs), tuple(dict.fromkeys(ctx.derived)))


def _inline(node: Node) -> Expansion:
    """A composite node's region with its arguments replaced by the node's operands."""
    if len(node.regions) != 1:
        raise NotDecomposed(f"{node.op}: a composite node carries one region, got {len(node.regions)}")
    (body,) = node.regions
    mapping = dict(zip(body.args, node.inputs))
    nodes = tuple(_substitute(n, mapping) for n in body.nodes)
    return Expansion(nodes, tuple(mapping.get(r, r) for r in body.results))


def _substitute(node: Node, mapping: dict[Value, Value]) -> Node:
    regions = tuple(
        Block(
            r.args,
            tuple(_substitute(n, mapping) for n in r.nodes),
            tuple(mapping.get(v, v) for v in r.results),
        )
        for r in node.regions
    )
    return dc_replace(node, inputs=tuple(mapping.get(v, v) for v in node.inputs), regions=regions)


class _Context(ShapeContext):
    """A context that also proves facts that follow from the divisibility assumptions
    (``Eq(Mod(c, G), 0)``, which group_norm's rule records, G a number; sdpa's with
    ``enable_gqa``, G the key or the value heads): ``c`` is then ``G*q``, and
    ``G*floor(c/G) == c`` holds, so a per-group reshape's element count checks. A size
    that is a multiple of several (q heads of k's and of v's) is tried as each."""

    __slots__ = ("_substitutions", "derived")

    def __init__(self, assumptions: Sequence[sympy.Basic]) -> None:
        super().__init__(assumptions=assumptions)
        multiples: list[tuple[sympy.Basic, sympy.Basic]] = []
        #: the facts proved that way (a verifier needs them stated)
        self.derived: list[sympy.Basic] = []
        for a in assumptions:
            if isinstance(a, sympy.Eq) and a.rhs == 0 and isinstance(a.lhs, sympy.Mod):
                s, k = a.lhs.args
                if isinstance(s, sympy.Symbol) and (k.is_Integer or k.is_Symbol):
                    multiples.append((s, k * sympy.Dummy(f"{s.name}_q", integer=True, positive=True)))
        first: dict[sympy.Basic, sympy.Basic] = {}
        for s, m in multiples:
            first.setdefault(s, m)
        #: each size written as the first multiple found of it, then each other one in turn
        self._substitutions = [first] if first else []
        self._substitutions += [{**first, s: m} for s, m in multiples if first[s] is not m]

    def prove(self, cond: sympy.Basic) -> bool | None:
        proved = super().prove(cond)
        for sub in self._substitutions:
            if proved is not None:
                break
            proved = prove(sympy.sympify(cond.xreplace(sub)))
            if proved is not None:
                self.derived.append(canonical(cond if proved else sympy.Not(cond)))
        return proved


def _same_type(a: Type, b: Type) -> bool:
    if isinstance(a, ScalarType) or isinstance(b, ScalarType):
        return a == b
    return (
        a.dtype == b.dtype
        and a.rank == b.rank
        and all(x == y or sympy.expand(sympy.sympify(x) - y) == 0 for x, y in zip(a.shape, b.shape))
    )


__all__ = [
    "LOW_PRECISION",
    "Builder",
    "Decomposition",
    "Expansion",
    "NotDecomposed",
    "Sym",
    "decomposition",
    "expand",
    "uses_decomposition",
    "where",
]
