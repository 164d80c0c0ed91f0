"""Every declared op, checked against torch itself.

Each case is one torch call. It is captured through the registry with symbolic
input sizes by a small emitter (below), and then:

1. the inferred output types must equal the types torch's fake kernels compute
   for the same call under the same symbolic sizes (:func:`fake_call`);
2. the emitted ops' ``reference`` functions, run on example tensors, must give
   what the eager torch call gives (exact dtype);
3. a graph of the emitted nodes must verify, and print -> parse -> print must
   give the same text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from cuvil_ir import (
    REGISTRY,
    DType,
    Graph,
    Node,
    NotCaptured,
    ScalarKind,
    ScalarType,
    ShapeContext,
    TensorType,
    Value,
    parse_graph,
    symbol,
    verify,
)
from cuvil_ir.graph_ir.fake import fake_call
from cuvil_ir.graph_ir.nodes import KV, Ref
from cuvil_ir.graph_ir.registry import infer_types
from cuvil_ir.symbolic import evaluate, evaluate_bool

T = torch.Tensor


# -- a minimal emitter: handles carry an IR value and an example tensor -----------------
class Handle:
    __slots__ = ("value", "example")

    def __init__(self, value: Value, example: Any) -> None:
        self.value = value
        self.example = example


def _check_attr(v: Any) -> None:
    if isinstance(v, tuple):
        for x in v:
            _check_attr(x)
        return
    assert v is None or isinstance(v, (bool, int, float, str, DType, sympy.Basic)), (
        f"bad attribute value {v!r}"
    )


def _evaluate_attr(v: Any, hints: dict[sympy.Symbol, int]) -> Any:
    if isinstance(v, sympy.Basic):
        # a Symbol is a sympy Boolean too; only non-Expr Booleans are conditions
        is_condition = isinstance(v, sympy.logic.boolalg.Boolean) and not isinstance(v, sympy.Expr)
        return evaluate_bool(v, hints) if is_condition else evaluate(v, hints)
    if isinstance(v, tuple):
        return tuple(_evaluate_attr(x, hints) for x in v)
    return v


class Emitter:
    def __init__(self, hints: dict[sympy.Symbol, int]) -> None:
        self.ctx = ShapeContext(hints)
        self.nodes: list[Node] = []
        self._n = 0

    def _fresh(self, t: Any) -> Value:
        self._n += 1
        return Value(f"t{self._n}", t)

    def _operand(self, h: Any) -> tuple[Value, Any]:
        if isinstance(h, Handle):
            return h.value, h.example
        assert isinstance(h, (bool, int, float, sympy.Basic)), f"cannot use {h!r} as an operand"
        v = self._fresh(ScalarType(ScalarKind.of(h)))
        self.nodes.append(Node("const", (), (v,), (("value", h),)))
        return v, _evaluate_attr(h, self.ctx.hints)

    def emit(self, op: str, inputs: Any, **attrs: Any) -> Any:
        opdef = REGISTRY.get(op)
        assert set(attrs) == set(opdef.attr_names), f"{op}: attributes {sorted(attrs)} vs {opdef.attr_names}"
        for v in attrs.values():
            _check_attr(v)
        operands = [self._operand(h) for h in inputs]
        types = infer_types(opdef, self.ctx, [v.type for v, _ in operands], attrs)
        outs = tuple(self._fresh(t) for t in types)
        self.nodes.append(Node(op, tuple(v for v, _ in operands), outs, tuple(attrs.items())))
        concrete = {k: _evaluate_attr(v, self.ctx.hints) for k, v in attrs.items()}
        result = opdef.reference(*[e for _, e in operands], **concrete)
        results = result if isinstance(result, tuple) else (result,)
        assert len(results) == len(outs), (
            f"{op}: reference gave {len(results)} values for {len(outs)} outputs"
        )
        handles = [Handle(v, r) for v, r in zip(outs, results)]
        return handles[0] if opdef.num_outputs == 1 else tuple(handles)

    def type_of(self, h: Any) -> Any:
        if isinstance(h, Handle):
            return h.value.type
        return ScalarType(ScalarKind.of(h))

    def is_value(self, h: Any) -> bool:
        return isinstance(h, Handle)

    def rebind(self, target: Handle, result: Handle) -> Handle:
        target.value, target.example = result.value, result.example
        return target


# -- cases --------------------------------------------------------------------------------
@dataclass(frozen=True)
class In:
    """The i-th input tensor."""

    i: int


@dataclass(frozen=True)
class Sz:
    """A size computed from the input shapes (sympy, torch SymInt or int, per mode)."""

    f: Callable[[list[Any]], Any]


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    static: bool = False  # parameters have static sizes, as the frontend lifts them
    low: int = -5
    high: int = 5


def t(
    *shape: int, dtype: torch.dtype = torch.float32, static: bool = False, low: int = -5, high: int = 5
) -> Spec:
    return Spec(shape, dtype, static, low, high)


@dataclass
class Case:
    id: str
    fn: Any
    args: tuple[Any, ...]
    inputs: tuple[Spec, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    check: str = "exact"  # "exact" | "dropout" | "shape" (values unspecified)
    ops: frozenset[str] | None = None  # exactly these ops must be emitted (besides const)


X, Y, Z, W = In(0), In(1), In(2), In(3)
CASES: list[Case] = []


def case(
    id: str,
    fn: Any,
    args: tuple[Any, ...],
    inputs: list[Spec],
    check: str = "exact",
    ops: set[str] | None = None,
    **kwargs: Any,
) -> None:
    CASES.append(Case(id, fn, args, tuple(inputs), kwargs, check, None if ops is None else frozenset(ops)))


def _resolve(tree: Any, tensors: list[Any], shapes: list[Any]) -> Any:
    if isinstance(tree, In):
        return tensors[tree.i]
    if isinstance(tree, Sz):
        return tree.f(shapes)
    if isinstance(tree, tuple):
        return tuple(_resolve(x, tensors, shapes) for x in tree)
    if isinstance(tree, list):
        return [_resolve(x, tensors, shapes) for x in tree]
    if isinstance(tree, dict):
        return {k: _resolve(v, tensors, shapes) for k, v in tree.items()}
    if isinstance(tree, slice):
        return slice(*(_resolve(x, tensors, shapes) for x in (tree.start, tree.stop, tree.step)))
    return tree


# -- comparing our sizes with torch's -------------------------------------------------------
def _holds(facts: list[Any], point: dict[sympy.Symbol, int]) -> bool:
    for f in facts:
        try:
            if not evaluate_bool(f, point):
                return False
        except (ValueError, TypeError, ZeroDivisionError):
            return False
    return True


def _dims_agree(mine: Any, theirs: Any, facts: list[Any], hints: dict[sympy.Symbol, int]) -> bool:
    """Equal as expressions; where sympy cannot show it, equal at every sampled size
    that satisfies the assumptions of both sides (the example sizes among them)."""
    m, th = sympy.sympify(mine), sympy.sympify(theirs)
    specialised = {
        f.lhs: f.rhs
        for f in facts
        if isinstance(f, sympy.Eq) and isinstance(f.lhs, sympy.Symbol) and sympy.sympify(f.rhs).is_Integer
    }
    m = m.xreplace(specialised)
    if sympy.simplify(m - th) == 0:
        return True
    syms = sorted((m.free_symbols | th.free_symbols), key=lambda s: s.name)
    rng = random.Random(0)
    points = [dict(hints)] + [
        {**hints, **{s: rng.randint(max(0, int(hints[s]) - 4), int(hints[s]) + 9) for s in syms}}
        for _ in range(60)
    ]
    checked = 0
    for p in points:
        if not _holds(facts, p):
            continue
        checked += 1
        try:
            if evaluate(m, p) != evaluate(th, p):
                return False
        except (ValueError, TypeError, ZeroDivisionError):
            return False
    return checked > 0


def _types_agree(
    mine: TensorType, theirs: TensorType, facts: list[Any], hints: dict[sympy.Symbol, int]
) -> bool:
    return (
        mine.dtype == theirs.dtype
        and mine.device == theirs.device
        and mine.rank == theirs.rank
        and all(_dims_agree(a, b, facts, hints) for a, b in zip(mine.shape, theirs.shape))
    )


# -- running a case -------------------------------------------------------------------------
def _example(spec: Spec, gen: torch.Generator) -> torch.Tensor:
    if spec.dtype.is_floating_point:
        return torch.randn(spec.shape, generator=gen).to(spec.dtype)
    if spec.dtype == torch.bool:
        return torch.randint(0, 2, spec.shape, generator=gen).bool()
    return torch.randint(spec.low, spec.high, spec.shape, generator=gen).to(spec.dtype)


def _inputs(c: Case) -> tuple[list[torch.Tensor], list[Value], dict[sympy.Symbol, int]]:
    gen = torch.Generator().manual_seed(sum(map(ord, c.id)))
    examples, values, hints = [], [], {}
    for i, spec in enumerate(c.inputs):
        ex = _example(spec, gen)
        dims: list[Any] = []
        for d, size in enumerate(spec.shape):
            if spec.static:
                dims.append(size)
            else:
                s = symbol(f"{'abcdefgh'[i]}{d}")
                hints[s] = size
                dims.append(s)
        examples.append(ex)
        values.append(Value("xyzwuvpq"[i], TensorType(DType.from_torch(spec.dtype), tuple(dims), "cpu")))
    return examples, values, hints


def capture(c: Case) -> tuple[Emitter, list[Value], list[torch.Tensor], Any]:
    examples, values, hints = _inputs(c)
    entry = REGISTRY.for_torch(c.fn)
    assert entry is not None, f"{c.fn} is not captured by any op"
    _, rule = entry
    em = Emitter(hints)
    handles = [Handle(v, e) for v, e in zip(values, examples)]
    shapes = [v.type.shape for v in values]
    result = rule(em, *_resolve(c.args, handles, shapes), **_resolve(c.kwargs, handles, shapes))
    return em, values, examples, result


def _check_values(c: Case, got: torch.Tensor, want: torch.Tensor, x: torch.Tensor | None) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if c.check == "exact":
        torch.testing.assert_close(
            got,
            want,
            equal_nan=True,
            rtol=1e-5 if got.is_floating_point() else 0,
            atol=1e-5 if got.is_floating_point() else 0,
        )
    elif c.check == "dropout":
        p = c.args[1]
        kept = got != 0
        torch.testing.assert_close(got[kept], (x / (1 - p))[kept])
        assert 0 < kept.float().mean().item() < 1


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_op(c: Case) -> None:
    em, values, examples, result = capture(c)
    outs = pytree.tree_leaves(result)
    assert outs and all(isinstance(h, Handle) for h in outs), f"capture returned {result!r}"
    emitted = {n.op for n in em.nodes} - {"const"}
    if c.ops is not None:
        assert emitted == c.ops, f"emitted {sorted(emitted)}, expected {sorted(c.ops)}"

    # (1) types: ours against torch's fake kernels on the same symbolic sizes
    fctx = ShapeContext(em.ctx.hints)

    def call(*tensors: Any) -> Any:
        shapes = [x.shape for x in tensors]
        return c.fn(*_resolve(c.args, list(tensors), shapes), **_resolve(c.kwargs, list(tensors), shapes))

    fake_types, _ = fake_call(
        fctx, call, [v.type for v in values], tuple(Ref(i) for i in range(len(values))), KV.of({}), c.id
    )
    assert len(fake_types) == len(outs)
    facts = em.ctx.assumptions + fctx.assumptions
    for h, ft in zip(outs, fake_types):
        assert _types_agree(h.value.type, ft, facts, em.ctx.hints), f"ours {h.value.type}, torch {ft}"

    # (2) values: the references against eager torch
    eager = pytree.tree_leaves(call(*examples))
    assert len(eager) == len(outs)
    for h, want in zip(outs, eager):
        assert [evaluate(d, em.ctx.hints) for d in h.value.type.shape] == list(want.shape)
        _check_values(c, h.example, want, examples[0] if examples else None)

    # (3) the graph verifies and survives print -> parse -> print
    g = Graph("f", tuple(values), tuple(em.nodes), tuple(h.value for h in outs), tuple(em.ctx.assumptions))
    verify(g)
    back = parse_graph(str(g))
    assert back.text == g.text
    verify(back)


def test_every_op_has_cases() -> None:
    seen: set[str] = set()
    for c in CASES:
        seen |= {n.op for n in capture(c)[0].nodes}
    # control-flow ops are built by the frontend, not captured: see test_control_ir.py
    regions = {n for n in REGISTRY.names() if "control_flow" in REGISTRY.get(n).traits}
    missing = set(REGISTRY.names()) - seen - {"extern"} - regions
    assert not missing, f"ops without a test case: {sorted(missing)}"


# -- calls that must fall back to extern ------------------------------------------------------
DECLINED = [
    Case("getitem-tensor-index", T.__getitem__, (X, Y), (t(4, 3), t(2, dtype=torch.int64, low=0, high=4))),
    Case(
        "batch_norm-train",
        F.batch_norm,
        (X, Y, Z),
        (t(2, 3), t(3, static=True), t(3, static=True)),
        {"training": True},
    ),
    Case("sdpa-dropout", F.scaled_dot_product_attention, (X, X, X), (t(1, 2, 4, 8),), {"dropout_p": 0.1}),
    Case("sum-out", torch.sum, (X,), (t(2, 3),), {"out": In(0)}),
    Case("to-cuda", T.to, (X, "cuda"), (t(2, 3),)),
    Case("view-dtype", T.view, (X, torch.int32), (t(2, 3),)),
    Case("max_pool-indices", F.max_pool2d, (X, 2), (t(1, 1, 4, 4),), {"return_indices": True}),
    Case(
        "embedding-max_norm",
        F.embedding,
        (X, Y),
        (t(3, dtype=torch.int64, low=0, high=5), t(5, 2, static=True)),
        {"max_norm": 1.0},
    ),
    Case("softmax-no-dim", F.softmax, (X,), (t(2, 3),)),
    Case("clamp-mixed-bounds", torch.clamp, (X,), (t(2, 3), t(3)), {"min": In(1), "max": 0.25}),
    Case("dropout2d-train", F.dropout2d, (X, 0.5, True), (t(1, 2, 3, 3),)),
]


@pytest.mark.parametrize("c", DECLINED, ids=lambda c: c.id)
def test_declined(c: Case) -> None:
    with pytest.raises(NotCaptured):
        capture(c)


# -- shape rules reject what torch rejects -----------------------------------------------------
def _tt(*shape: Any, dtype: DType = DType.f32) -> TensorType:
    return TensorType(dtype, shape)


REJECTED = [
    ("matmul", (_tt(2, 3), _tt(4, 5)), {}),
    ("matmul", (_tt(2, 3), _tt(3, dtype=DType.f64)), {}),
    ("cat", (_tt(2, 3), _tt(3, 3)), {"dim": 1}),
    ("reshape", (_tt(2, 3),), {"shape": (4, -1)}),
    ("reshape", (_tt(2, 3),), {"shape": (-1, -1)}),
    ("squeeze", (_tt(2, 3),), {"dims": (0,)}),
    ("expand", (_tt(2, 3),), {"shape": (4, 3)}),
    ("split", (_tt(5, 2),), {"dim": 0, "sizes": (2, 2)}),
    ("select", (_tt(3, 2),), {"dim": 0, "index": 3}),
    ("select", (_tt(3, 2),), {"dim": 0, "index": -4}),
    ("permute", (_tt(3, 2),), {"perm": (0, 0)}),
    ("mean", (_tt(3, dtype=DType.i64),), {"dims": (0,), "keepdim": False, "dtype": None}),
    ("var", (_tt(3, dtype=DType.i32),), {"dims": (0,), "correction": 1, "keepdim": False}),
    ("softmax", (_tt(3, dtype=DType.i64),), {"dim": 0, "dtype": None}),
    ("linear", (_tt(2, 3), _tt(4, 5)), {"has_bias": False}),
    (
        "conv",
        (_tt(1, 4, 5, 5), _tt(2, 3, 3, 3)),
        {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1, "has_bias": False},
    ),
    (
        "conv",
        (_tt(1, 3, 2, 2), _tt(2, 3, 3, 3)),
        {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1, "has_bias": False},
    ),
    ("group_norm", (_tt(2, 5, 3),), {"num_groups": 2, "eps": 1e-5, "has_weight": False, "has_bias": False}),
    (
        "layer_norm",
        (_tt(2, 3), _tt(4)),
        {"normalized_shape": (3,), "eps": 1e-5, "has_weight": True, "has_bias": False},
    ),
    ("embedding", (_tt(3, dtype=DType.f32), _tt(5, 2)), {}),
    ("arange", (), {"start": 5, "end": 0, "step": 1, "dtype": DType.i64, "device": "cpu"}),
    ("argmax", (_tt(3, dtype=DType.bool),), {"dim": None, "keepdim": False}),
]


@pytest.mark.parametrize("op,types,attrs", REJECTED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REJECTED)])
def test_rejects(op: str, types: tuple[TensorType, ...], attrs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # ShapeError (a ValueError)
        infer_types(REGISTRY.get(op), ShapeContext({}), list(types), attrs)


# == the case table ===============================================================================
S = t  # alias for readability in the table

# -- elementwise: the first declarations --------------------------------------------------------
for _name, _fn, _first, _alt in [
    ("abs", T.__abs__, torch.float32, torch.int32),
    ("neg", torch.neg, torch.float32, torch.int64),
    ("exp", torch.exp, torch.float32, torch.int64),
    ("log", T.log, torch.float64, torch.int32),
    ("sqrt", torch.sqrt, torch.float32, torch.int64),
    ("rsqrt", T.rsqrt, torch.float32, torch.float16),
    ("erf", torch.special.erf, torch.float32, torch.int64),
    ("tanh", F.tanh, torch.float32, torch.int64),
    ("sigmoid", torch.sigmoid, torch.float32, torch.bool),
    ("relu", F.relu, torch.float32, torch.int64),
    ("silu", F.silu, torch.float32, torch.float64),
    ("logical_not", torch.logical_not, torch.float32, torch.int64),
]:
    case(f"{_name}-a", _fn, (X,), [S(3, 4, dtype=_first)], ops={_name})
    case(f"{_name}-b", _fn, (X,), [S(2, 1, 5, dtype=_alt)], ops={_name})
for _name, _fn, _reflected in [
    ("add", T.__add__, T.__radd__),
    ("sub", torch.sub, T.__rsub__),
    ("mul", T.mul, T.__rmul__),
    ("div", T.__truediv__, T.__rtruediv__),
    ("pow", torch.pow, T.__rpow__),
    ("maximum", torch.maximum, None),
    ("minimum", T.minimum, None),
    ("eq", T.__eq__, None),
    ("ne", torch.ne, None),
    ("lt", T.__lt__, None),
    ("le", torch.le, None),
    ("gt", T.gt, None),
    ("ge", T.__ge__, None),
    ("logical_and", torch.logical_and, None),
    ("logical_or", T.logical_or, None),
]:
    case(f"{_name}-broadcast", _fn, (X, Y), [S(3, 1), S(1, 4, dtype=torch.float64)], ops={_name})
    case(
        f"{_name}-int",
        _fn,
        (X, Y),
        [S(2, 3, dtype=torch.int64, low=1, high=4), S(3, dtype=torch.int32, low=1, high=4)],
        ops={_name},
    )
    if _name not in ("maximum", "minimum", "logical_and", "logical_or"):  # torch takes tensors only
        case(f"{_name}-scalar", _fn, (X, 2), [S(2, 1, 3, dtype=torch.float16)], ops={_name})
    if _reflected is not None:
        case(f"{_name}-reflected", _reflected, (X, 3), [S(4, dtype=torch.int64, low=1, high=4)], ops={_name})
case(
    "where",
    torch.where,
    (X, Y, Z),
    [S(2, 1, dtype=torch.bool), S(3), S(2, 3, dtype=torch.float64)],
    ops={"where"},
)
case("where-method", T.where, (X, Y, 0.0), [S(3, 2), S(3, 2, dtype=torch.bool)], ops={"where"})

# -- elementwise: unary ------------------------------------------------------------------------
_UNARY = [
    ("sin", torch.sin, torch.int64),
    ("cos", T.cos, torch.int64),
    ("tan", torch.tan, torch.float64),
    ("atan", torch.arctan, torch.int32),
    ("log1p", torch.log1p, torch.float64),
    ("log2", T.log2, torch.int64),
    ("expm1", torch.expm1, torch.int64),
    ("reciprocal", torch.reciprocal, torch.int64),
    ("floor", torch.floor, torch.int64),
    ("ceil", T.ceil, torch.int32),
    ("trunc", torch.fix, torch.float64),
    ("sign", torch.sign, torch.bool),
    ("bitwise_not", T.__invert__, torch.bool),
    ("hardswish", F.hardswish, torch.float64),
    ("hardsigmoid", F.hardsigmoid, torch.float64),
    ("mish", F.mish, torch.float64),
    ("logsigmoid", F.logsigmoid, torch.float64),
    ("square", torch.square, torch.bool),
    ("round", torch.round, torch.int64),
]
for _name, _fn, _alt in _UNARY:
    _first = torch.int64 if _name == "bitwise_not" else torch.float32
    case(f"{_name}-a", _fn, (X,), [S(3, 4, dtype=_first)], ops={_name})
    case(f"{_name}-b", _fn, (X,), [S(2, 1, 5, dtype=_alt)], ops={_name})
case("round-decimals", torch.round, (X,), [S(4, 3)], decimals=2, ops={"round"})

# -- elementwise: binary -----------------------------------------------------------------------
_INT = {"dtype": torch.int64, "low": 1, "high": 9}
case(
    "floor_divide-broadcast",
    torch.floor_divide,
    (X, Y),
    [S(3, 1, **_INT), S(1, 4, **_INT)],
    ops={"floor_divide"},
)
case("floor_divide-float", T.__floordiv__, (X, 2.5), [S(2, 3)])
case("floor_divide-reflected", T.__rfloordiv__, (X, 7), [S(4, **_INT)])
case("remainder-int", T.__mod__, (X, 3), [S(2, 5, dtype=torch.int64, low=-9, high=9)], ops={"remainder"})
case("remainder-mixed", torch.remainder, (X, Y), [S(2, 1, 3), S(4, 3, **_INT)])
case("remainder-reflected", T.__rmod__, (X, 10), [S(5, **_INT)])
case("fmod", torch.fmod, (X, Y), [S(2, 3), S(1, 3)], ops={"fmod"})
case("fmod-int", T.fmod, (X, 4), [S(6, dtype=torch.int32, low=-9, high=9)])
case("atan2", torch.atan2, (X, Y), [S(3, 1), S(1, 2)], ops={"atan2"})
case("atan2-int", torch.arctan2, (X, Y), [S(4, dtype=torch.int64), S(4, dtype=torch.int64)])
case(
    "bitwise_and",
    T.__and__,
    (X, Y),
    [S(2, 3, dtype=torch.bool), S(1, 3, dtype=torch.bool)],
    ops={"bitwise_and"},
)
case("bitwise_and-int", torch.bitwise_and, (X, 6), [S(5, dtype=torch.int64, low=0, high=16)])
case(
    "bitwise_or",
    T.__or__,
    (X, Y),
    [S(3, dtype=torch.int32, low=0, high=9), S(3, dtype=torch.int64, low=0, high=9)],
    ops={"bitwise_or"},
)
case("bitwise_or-reflected", T.__ror__, (X, 1), [S(2, 2, dtype=torch.int64, low=0, high=9)])
case(
    "bitwise_xor",
    T.__xor__,
    (X, Y),
    [S(2, 3, dtype=torch.bool), S(2, 3, dtype=torch.bool)],
    ops={"bitwise_xor"},
)
case("bitwise_xor-reflected", T.__rxor__, (X, 5), [S(4, dtype=torch.int64, low=0, high=9)])
case("logical_xor", torch.logical_xor, (X, Y), [S(2, 3), S(3, dtype=torch.bool)], ops={"logical_xor"})
case("logical_xor-int", T.logical_xor, (X, Y), [S(1, 4, dtype=torch.int64), S(3, 1, dtype=torch.int64)])
case(
    "masked_fill",
    T.masked_fill,
    (X, Y, float("-inf")),
    [S(2, 3, 4), S(1, 4, dtype=torch.bool)],
    ops={"where"},
)
case(
    "masked_fill-int",
    torch.masked_fill,
    (X, Y, 2.5),
    [S(3, 2, dtype=torch.int64), S(3, 2, dtype=torch.bool)],
    ops={"where", "cast"},
)
case(
    "masked_fill-tensor-value",
    T.masked_fill,
    (X, Y, Z),
    [S(2, 3, dtype=torch.float16), S(2, 3, dtype=torch.bool), S(dtype=torch.float32)],
)

# -- casts ------------------------------------------------------------------------------------------
case("to-dtype", T.to, (X, torch.float16), [S(2, 3)], ops={"cast"})
case("to-kw", T.to, (X,), [S(3, 1)], dtype=torch.int32, device="cpu", ops={"cast"})
case("to-same", T.to, (X, torch.float32), [S(2, 3)], ops=set())
case("to-device-same", T.to, (X, "cpu"), [S(4)], ops=set())
case("to-copy", T.to, (X, torch.float32), [S(2)], copy=True, ops={"cast"})
case("to-other", T.to, (X, Y), [S(2, 3, dtype=torch.int64), S(1, dtype=torch.float64)], ops={"cast"})
case("float", T.float, (X,), [S(2, 3, dtype=torch.int64)], ops={"cast"})
case("half", T.half, (X,), [S(4, 1)], ops={"cast"})
case("double", T.double, (X,), [S(3, dtype=torch.bool)], ops={"cast"})
case("bfloat16", T.bfloat16, (X,), [S(3, 2)], ops={"cast"})
case("long", T.long, (X,), [S(2, 2)], ops={"cast"})
case("int", T.int, (X,), [S(5, dtype=torch.int64)], ops={"cast"})
case("bool", T.bool, (X,), [S(2, 3, dtype=torch.int64, low=-1, high=2)], ops={"cast"})
case("type_as", T.type_as, (X, Y), [S(2, 3), S(2, dtype=torch.int32)], ops={"cast"})
case("type-dtype", T.type, (X, torch.float64), [S(3)], ops={"cast"})
case("cpu", T.cpu, (X,), [S(3)], ops=set())

# -- clamp and activations ----------------------------------------------------------------------
case("clamp", torch.clamp, (X, -0.5, 0.5), [S(3, 4)], ops={"clamp"})
case("clamp-min-int", T.clamp, (X,), [S(2, 1, 3, dtype=torch.int64)], min=0, ops={"clamp"})
case("clamp-promote", torch.clamp, (X,), [S(4, dtype=torch.int64)], min=0.5, ops={"clamp"})
case("clamp-tensor", torch.clamp, (X,), [S(2, 3), S(1, 3)], max=Y, ops={"minimum"})
case("clamp-tensors", torch.clamp, (X, Y, Z), [S(2, 3), S(3), S(2, 1)], ops={"maximum", "minimum"})
case("clip", T.clip, (X, 0.0), [S(5, 2)], ops={"clamp"})
case("clamp_min", torch.clamp_min, (X, 0.1), [S(2, 3)], ops={"clamp"})
case("clamp_max", T.clamp_max, (X, -0.1), [S(3, 1)], ops={"clamp"})
case("hardtanh", F.hardtanh, (X, -2.0, 2.0), [S(3, 4)], ops={"clamp"})
case("relu6", F.relu6, (X,), [S(2, 5)], ops={"clamp"})
case("gelu", F.gelu, (X,), [S(3, 4)], ops={"gelu"})
case("gelu-tanh", F.gelu, (X,), [S(2, 1, 3, dtype=torch.float64)], approximate="tanh", ops={"gelu"})
case("leaky_relu", F.leaky_relu, (X,), [S(3, 4)], ops={"leaky_relu"})
case("leaky_relu-slope", F.leaky_relu, (X, 0.2), [S(2, 6)], ops={"leaky_relu"})
case("elu", F.elu, (X,), [S(4, 3)], ops={"elu"})
case("elu-alpha", F.elu, (X,), [S(1, 5)], alpha=0.5, ops={"elu"})
case("softplus", F.softplus, (X,), [S(3, 4)], ops={"softplus"})
case("softplus-beta", F.softplus, (X, 2.0, 1.0), [S(2, 1, 3)], ops={"softplus"})
case("dropout-eval", F.dropout, (X, 0.3, False), [S(3, 4)], ops=set())
case("dropout-train", F.dropout, (X, 0.5, True), [S(20, 30)], check="dropout", ops={"dropout"})
case("dropout-train-2", F.dropout, (X, 0.25), [S(8, 3, 20)], check="dropout", ops={"dropout"})
case("torch-dropout-eval", torch.dropout, (X, 0.2, False), [S(4)], ops=set())
case("dropout2d-eval", F.dropout2d, (X, 0.5, False), [S(1, 2, 3, 3)], ops=set())

# -- reductions ---------------------------------------------------------------------------------
case("sum", torch.sum, (X, 1), [S(2, 3, 4)], ops={"sum"})
case("sum-all-int", T.sum, (X,), [S(3, 4, dtype=torch.int32)], ops={"sum"})
case("sum-dims-dtype", torch.sum, (X, (0, -1), True), [S(2, 1, 3)], dtype=torch.float64, ops={"sum"})
case("mean", T.mean, (X, -1), [S(3, 5)], keepdim=True, ops={"mean"})
case("mean-all", torch.mean, (X,), [S(2, 3, 2)], ops={"mean"})
case("mean-int-dtype", torch.mean, (X, [0]), [S(4, 2, dtype=torch.int64)], dtype=torch.float32, ops={"mean"})
case("prod", torch.prod, (X, 1), [S(2, 3, dtype=torch.int32, low=1, high=4)], ops={"prod"})
case("prod-all", T.prod, (X,), [S(2, 3)], ops={"prod"})
case("prod-keepdim", torch.prod, (X, -1, True), [S(3, 2)], ops={"prod"})
case("amax", torch.amax, (X, (1, 2)), [S(2, 3, 4)], ops={"amax"})
case("amax-all", T.amax, (X,), [S(3, 1)], ops={"amax"})
case("amin", T.amin, (X, 0, True), [S(4, 3)], ops={"amin"})
case("amin-int", torch.amin, (X, -1), [S(2, 5, dtype=torch.int64)], ops={"amin"})
case("all", torch.all, (X, 1), [S(3, 4, dtype=torch.bool)], ops={"all"})
case("all-u8", T.all, (X,), [S(2, 3, dtype=torch.uint8, low=0, high=3)], ops={"all"})
case("any", T.any, (X, -1, True), [S(2, 3)], ops={"any"})
case("any-all", torch.any, (X,), [S(4, dtype=torch.bool)], ops={"any"})
case("logsumexp", torch.logsumexp, (X, 1), [S(2, 5)], ops={"logsumexp"})
case("logsumexp-keep", T.logsumexp, (X, (0, 1), True), [S(3, 2, 2)], ops={"logsumexp"})
case("var", torch.var, (X, 1), [S(3, 5)], ops={"var"})
case("var-unbiased-false", T.var, (X, 0, False, True), [S(4, 3)], ops={"var"})
case("var-correction", torch.var, (X,), [S(2, 6)], dim=(0, 1), correction=0, keepdim=True, ops={"var"})
case("var-all-bool-arg", T.var, (X, False), [S(3, 3)], ops={"var"})
case("std", torch.std, (X, (0, 2)), [S(2, 3, 4)], ops={"std"})
case(
    "std-all",
    T.std,
    (X,),
    [
        S(
            5,
        )
    ],
    ops={"std"},
)
case("var_mean", torch.var_mean, (X, 1), [S(3, 4)], ops={"var", "mean"})
case("std_mean", torch.std_mean, (X,), [S(4, 3)], dim=0, correction=2, ops={"std", "mean"})
case("max-all", torch.max, (X,), [S(3, 4)], ops={"amax"})
case("max-dim", torch.max, (X, 1), [S(3, 4)], ops={"max"})
case("max-keepdim", T.max, (X,), [S(2, 3, 2)], dim=0, keepdim=True, ops={"max"})
case("max-pairwise", torch.max, (X, Y), [S(2, 3), S(1, 3)], ops={"maximum"})
case("min-dim", T.min, (X, -1), [S(4, 5, dtype=torch.int64)], ops={"min"})
case("min-keepdim", torch.min, (X, 0, True), [S(3, 1)], ops={"min"})
case("min-all", T.min, (X,), [S(2, 2)], ops={"amin"})
case("argmax", torch.argmax, (X,), [S(3, 4)], ops={"argmax"})
case("argmax-dim", T.argmax, (X, 1, True), [S(2, 5)], ops={"argmax"})
case("argmin", torch.argmin, (X, -1), [S(3, 2, 4)], ops={"argmin"})
case("argmin-keep-all", T.argmin, (X,), [S(2, 3)], keepdim=True, ops={"argmin"})
case("cumsum", torch.cumsum, (X, 1), [S(2, 4)], ops={"cumsum"})
case("cumsum-int", T.cumsum, (X, -1), [S(3, dtype=torch.int32)], ops={"cumsum"})
case("cumsum-dtype", torch.cumsum, (X, 0), [S(3, 2)], dtype=torch.float64, ops={"cumsum"})
case("cumprod", torch.cumprod, (X, 0), [S(4, 2)], ops={"cumprod"})
case("cumprod-bool", T.cumprod, (X, 1), [S(2, 3, dtype=torch.bool)], ops={"cumprod"})

# -- softmax and norms -----------------------------------------------------------------------------
case("softmax", F.softmax, (X,), [S(2, 5)], dim=-1, ops={"softmax"})
case(
    "softmax-dtype",
    torch.softmax,
    (X, 1),
    [S(3, 4, 2, dtype=torch.float16)],
    dtype=torch.float32,
    ops={"softmax"},
)
case("softmax-method", T.softmax, (X, 0), [S(4, 1)], ops={"softmax"})
case("log_softmax", F.log_softmax, (X, 1), [S(2, 6)], ops={"log_softmax"})
case("log_softmax-method", T.log_softmax, (X, -1), [S(3, 2, 4, dtype=torch.float64)], ops={"log_softmax"})
case(
    "layer_norm",
    F.layer_norm,
    (X, (4,), Y, Z),
    [S(2, 3, 4), S(4, static=True), S(4, static=True)],
    ops={"layer_norm"},
)
case(
    "layer_norm-2d-no-affine",
    F.layer_norm,
    (X, Sz(lambda s: s[0][1:])),
    [S(2, 3, 4)],
    eps=1e-3,
    ops={"layer_norm"},
)
case(
    "layer_norm-bias-only", F.layer_norm, (X, [5], None, Y), [S(3, 5), S(5, static=True)], ops={"layer_norm"}
)
case("rms_norm", F.rms_norm, (X, (4,), Y), [S(2, 3, 4), S(4, static=True)], ops={"rms_norm"})
case("rms_norm-eps", F.rms_norm, (X, [3, 2]), [S(2, 3, 2)], eps=1e-4, ops={"rms_norm"})
case(
    "batch_norm",
    F.batch_norm,
    (X, Y, Z, W),
    [S(2, 3, 4, 5), S(3, static=True), S(3, static=True, low=1), S(3, static=True)],
    ops={"batch_norm"},
)
case(
    "batch_norm-affine",
    F.batch_norm,
    (X, Y, Z, W, In(4)),
    [S(4, 3), S(3, static=True), S(3, static=True), S(3, static=True), S(3, static=True)],
    eps=1e-3,
    ops={"batch_norm"},
)
case("group_norm", F.group_norm, (X, 2), [S(2, 4, 3, 3)], ops={"group_norm"})
case(
    "group_norm-affine",
    F.group_norm,
    (X, 3, Y, Z),
    [S(1, 6, 5), S(6, static=True), S(6, static=True)],
    ops={"group_norm"},
)

# -- matrix products ----------------------------------------------------------------------------
case("matmul-vv", torch.matmul, (X, Y), [S(4), S(4)], ops={"matmul"})
case("matmul-mv", torch.matmul, (X, Y), [S(3, 4), S(4)], ops={"matmul"})
case("matmul-vm-batched", T.matmul, (X, Y), [S(4), S(2, 4, 3)], ops={"matmul"})
case("matmul-batched-2d", T.__matmul__, (X, Y), [S(2, 3, 4), S(4, 5, static=True)], ops={"matmul"})
case("matmul-broadcast", torch.matmul, (X, Y), [S(2, 1, 3, 4), S(5, 4, 2)], ops={"matmul"})
case("rmatmul", T.__rmatmul__, (X, Y), [S(4, 2), S(3, 4)], ops={"matmul"})
case("mm", torch.mm, (X, Y), [S(3, 4), S(4, 2)], ops={"matmul"})
case("bmm", T.bmm, (X, Y), [S(2, 3, 4), S(2, 4, 5)], ops={"matmul"})
case("mv", torch.mv, (X, Y), [S(3, 4), S(4)], ops={"matmul"})
case("dot", T.dot, (X, Y), [S(5, dtype=torch.float64), S(5, dtype=torch.float64)], ops={"matmul"})
case("addmm", torch.addmm, (X, Y, Z), [S(5), S(3, 4), S(4, 5)], ops={"matmul", "add"})
case(
    "addmm-scaled",
    T.addmm,
    (X, Y, Z),
    [S(3, 1), S(3, 4), S(4, 2)],
    beta=0.5,
    alpha=2.0,
    ops={"matmul", "mul", "add"},
)
case("baddbmm", torch.baddbmm, (X, Y, Z), [S(2, 3, 5), S(2, 3, 4), S(2, 4, 5)], beta=0.0, ops={"matmul"})
case("linear", F.linear, (X, Y, Z), [S(2, 3, 4), S(5, 4, static=True), S(5, static=True)], ops={"linear"})
case("linear-no-bias", F.linear, (X, Y), [S(3, 4), S(2, 4, static=True)], ops={"linear"})
case("linear-1d-weight", F.linear, (X, Y), [S(2, 4), S(4, static=True)], ops={"linear"})

# -- convolution and pooling --------------------------------------------------------------------
case(
    "conv2d",
    F.conv2d,
    (X, Y, Z),
    [S(2, 3, 9, 10), S(4, 3, 3, 3, static=True), S(4, static=True)],
    stride=2,
    padding=1,
    ops={"conv"},
)
case(
    "conv2d-same-dilated",
    F.conv2d,
    (X, Y),
    [S(1, 2, 7, 6), S(3, 2, 3, 2, static=True)],
    padding="same",
    dilation=2,
    ops={"conv"},
)
case(
    "conv2d-groups-unbatched",
    F.conv2d,
    (X, Y),
    [S(4, 8, 8), S(6, 2, 3, 3, static=True)],
    groups=2,
    stride=(1, 2),
    ops={"conv"},
)
case(
    "conv2d-valid",
    torch.conv2d,
    (X, Y),
    [S(1, 1, 5, 5), S(2, 1, 2, 2, static=True)],
    padding="valid",
    ops={"conv"},
)
case(
    "conv1d",
    F.conv1d,
    (X, Y, Z),
    [S(2, 3, 11), S(4, 3, 5, static=True), S(4, static=True)],
    stride=3,
    padding=2,
    ops={"conv"},
)
case("conv3d", F.conv3d, (X, Y), [S(1, 2, 4, 5, 6), S(2, 2, 2, 3, 2, static=True)], ops={"conv"})
case(
    "conv_transpose2d",
    F.conv_transpose2d,
    (X, Y, Z),
    [S(1, 4, 5, 6), S(4, 3, 3, 3, static=True), S(3, static=True)],
    stride=2,
    padding=1,
    output_padding=1,
    ops={"conv_transpose"},
)
case(
    "conv_transpose1d-groups",
    F.conv_transpose1d,
    (X, Y),
    [S(2, 4, 7), S(4, 1, 3, static=True)],
    groups=2,
    dilation=2,
    ops={"conv_transpose"},
)
case("max_pool2d", F.max_pool2d, (X, 3, 2, 1), [S(2, 3, 9, 10)], ops={"max_pool"})
case(
    "max_pool2d-ceil-dilated",
    F.max_pool2d,
    (X, (2, 3)),
    [S(1, 2, 8, 11)],
    stride=2,
    dilation=(2, 1),
    ceil_mode=True,
    ops={"max_pool"},
)
case("max_pool2d-ceil-edge", F.max_pool2d, (X, 2, 2), [S(1, 1, 5, 7)], ceil_mode=True, ops={"max_pool"})
case("max_pool1d", F.max_pool1d, (X, 2), [S(2, 3, 7)], ops={"max_pool"})
case("max_pool2d-unbatched", F.max_pool2d, (X, 2), [S(3, 6, 4)], ops={"max_pool"})
case(
    "avg_pool2d",
    F.avg_pool2d,
    (X, 3, 2, 1),
    [S(2, 3, 9, 10)],
    ceil_mode=True,
    count_include_pad=False,
    ops={"avg_pool"},
)
case("avg_pool2d-divisor", F.avg_pool2d, (X, 2), [S(1, 2, 4, 6)], divisor_override=3, ops={"avg_pool"})
case("avg_pool1d", F.avg_pool1d, (X, 3), [S(2, 2, 10)], stride=2, ops={"avg_pool"})
case(
    "adaptive_avg_pool2d", F.adaptive_avg_pool2d, (X, (3, None)), [S(2, 3, 9, 10)], ops={"adaptive_avg_pool"}
)
case("adaptive_avg_pool2d-1", F.adaptive_avg_pool2d, (X, 1), [S(1, 4, 5, 5)], ops={"adaptive_avg_pool"})
case("adaptive_avg_pool1d", F.adaptive_avg_pool1d, (X, 2), [S(3, 7)], ops={"adaptive_avg_pool"})
case("adaptive_max_pool2d", F.adaptive_max_pool2d, (X, 2), [S(2, 3, 5, 4)], ops={"adaptive_max_pool"})
case("adaptive_max_pool1d", F.adaptive_max_pool1d, (X, 3), [S(1, 2, 9)], ops={"adaptive_max_pool"})

# -- embedding, pad, interpolate, attention ------------------------------------------------------------
case(
    "embedding",
    F.embedding,
    (X, Y),
    [S(2, 3, dtype=torch.int64, low=0, high=10), S(10, 4, static=True)],
    ops={"embedding"},
)
case(
    "embedding-padding-idx",
    F.embedding,
    (X, Y),
    [S(5, dtype=torch.int32, low=0, high=6), S(6, 3)],
    padding_idx=0,
    ops={"embedding"},
)
case("pad", F.pad, (X, (1, 2)), [S(2, 3)], ops={"pad"})
case("pad-value-2d", F.pad, (X, (1, 1, 2, 0)), [S(2, 3, 4)], value=1.5, ops={"pad"})
# torch's fake kernel cannot crop symbolic sizes; a static input checks the rule
case("pad-crop", F.pad, (X, (-1, 0, 0, -2)), [S(3, 5, 4, static=True)], ops={"pad"})
case("pad-reflect", F.pad, (X, (2, 1)), [S(1, 2, 6)], mode="reflect", ops={"pad"})
case("pad-replicate-2d", F.pad, (X, (1, 1, 1, 1)), [S(1, 2, 3, 4)], mode="replicate", ops={"pad"})
case("interpolate-nearest", F.interpolate, (X,), [S(1, 2, 3, 4)], scale_factor=2.0, ops={"interpolate"})
case(
    "interpolate-bilinear-size",
    F.interpolate,
    (X,),
    [S(2, 3, 4, 5)],
    size=(5, 7),
    mode="bilinear",
    align_corners=True,
    ops={"interpolate"},
)
case(
    "interpolate-bilinear-scale",
    F.interpolate,
    (X,),
    [S(1, 2, 5, 6)],
    scale_factor=1.5,
    mode="bilinear",
    ops={"interpolate"},
)
case("interpolate-nearest-1d", F.interpolate, (X,), [S(2, 3, 5)], scale_factor=0.5, ops={"interpolate"})
# torch's fake kernels need concrete sizes for these two; static inputs check the rule
case(
    "interpolate-computed-size",
    F.interpolate,
    (X, Sz(lambda s: (s[0][2] * 2, s[0][3] + 1))),
    [S(1, 1, 3, 4, static=True)],
    ops={"interpolate"},
)
case(
    "upsample-recompute",
    F.interpolate,
    (X,),
    [S(1, 2, 7, 5, static=True)],
    scale_factor=(1.7, 0.6),
    mode="nearest",
    recompute_scale_factor=True,
    ops={"interpolate"},
)
case(
    "sdpa",
    F.scaled_dot_product_attention,
    (X, Y, Z),
    [S(2, 3, 4, 8), S(2, 3, 5, 8), S(2, 3, 5, 6)],
    ops={"sdpa"},
)
case(
    "sdpa-causal-scale",
    F.scaled_dot_product_attention,
    (X, X, X),
    [S(1, 2, 4, 8)],
    is_causal=True,
    scale=0.3,
    ops={"sdpa"},
)
case(
    "sdpa-bool-mask",
    F.scaled_dot_product_attention,
    (X, Y, Y, Z),
    [S(2, 2, 3, 4), S(2, 2, 5, 4), S(1, 1, 3, 5, dtype=torch.bool)],
    ops={"sdpa"},
)
case(
    "sdpa-float-mask",
    F.scaled_dot_product_attention,
    (X, X, X),
    [S(1, 4, 4), S(4, 4)],
    attn_mask=Y,
    ops={"sdpa"},
)
case(
    "sdpa-gqa",
    F.scaled_dot_product_attention,
    (X, Y, Y),
    [S(1, 4, 3, 8), S(1, 2, 3, 8)],
    enable_gqa=True,
    ops={"sdpa"},
)

# -- shape ops -------------------------------------------------------------------------------------
case("view-minus-one", T.view, (X, Sz(lambda s: s[0][0]), -1), [S(2, 3, 4)], ops={"reshape"})
case("view-flat", T.view, (X, -1), [S(3, 1, 2)], ops={"reshape"})
case("reshape-divisible", torch.reshape, (X, (-1, 4)), [S(3, 8)], ops={"reshape"})
case("reshape-3", T.reshape, (X, 3, -1), [S(6, 2, 5)], ops={"reshape"})
case(
    "reshape-symbolic",
    T.reshape,
    (X, Sz(lambda s: (s[0][0] * s[0][1], s[0][2]))),
    [S(2, 3, 4)],
    ops={"reshape"},
)
case("view_as", T.view_as, (X, Y), [S(2, 6), S(3, 4)], ops={"reshape"})
case("flatten", torch.flatten, (X, 1), [S(2, 3, 4)], ops={"reshape"})
case("flatten-all", T.flatten, (X,), [S(2, 1, 3)], ops={"reshape"})
case("flatten-one-dim", T.flatten, (X, 1, 1), [S(2, 3)], ops=set())
case("ravel", T.ravel, (X,), [S(3, 2)], ops={"reshape"})
case("unflatten", T.unflatten, (X, 1, (2, -1)), [S(3, 8)], ops={"reshape"})
case("unflatten-static", torch.unflatten, (X, -1, (3, 2)), [S(2, 6)], ops={"reshape"})
case("permute", T.permute, (X, 2, 0, 1), [S(2, 3, 4)], ops={"permute"})
case("permute-tuple", torch.permute, (X, (1, 0)), [S(3, 1)], ops={"permute"})
case("permute-identity", T.permute, (X, 0, 1), [S(2, 3)], ops=set())
case("transpose", T.transpose, (X, 0, -1), [S(2, 3, 4)], ops={"permute"})
case("swapaxes", torch.swapaxes, (X, 1, 2), [S(2, 1, 3)], ops={"permute"})
case("t", T.t, (X,), [S(3, 4)], ops={"permute"})
case("t-1d", torch.t, (X,), [S(3)], ops=set())
case("T", T.T.__get__, (X,), [S(3, 2)], ops={"permute"})
case("mT", T.mT.__get__, (X,), [S(2, 3, 4)], ops={"permute"})
case("movedim", torch.movedim, (X, 0, -1), [S(2, 3, 4)], ops={"permute"})
case("movedim-multi", T.movedim, (X, (0, 1), (2, 0)), [S(2, 3, 4)], ops={"permute"})
case("unsqueeze", torch.unsqueeze, (X, -1), [S(2, 3)], ops={"unsqueeze"})
case("unsqueeze-0", T.unsqueeze, (X, 0), [S(4)], ops={"unsqueeze"})
case("squeeze-all", T.squeeze, (X,), [S(1, 3, 1, 2)], ops={"squeeze"})
case("squeeze-dim", torch.squeeze, (X, 1), [S(3, 1)], ops={"squeeze"})
case("squeeze-noop", T.squeeze, (X, 0), [S(3, 2)], ops=set())
case("squeeze-dims", T.squeeze, (X, (0, 2)), [S(1, 4, 1)], ops={"squeeze"})
case("expand", T.expand, (X, 3, -1, 4), [S(2, 1)], ops={"expand"})
case("expand-symbolic", T.expand, (X, Sz(lambda s: (s[1][0], s[0][1]))), [S(1, 3), S(5)], ops={"expand"})
case("expand_as", T.expand_as, (X, Y), [S(3, 1), S(2, 3, 4)], ops={"expand"})
case("broadcast_to", torch.broadcast_to, (X, (2, 3)), [S(3)], ops={"expand"})
case("repeat", T.repeat, (X, 2, 1, 3), [S(2, 3)], ops={"repeat"})
case("repeat-tuple", T.repeat, (X, (2, 2)), [S(1, 3)], ops={"repeat"})
case("flip", torch.flip, (X, (0, -1)), [S(2, 3, 4)], ops={"flip"})
case("flip-method", T.flip, (X, 1), [S(3, 2)], ops={"flip"})
case("contiguous", T.contiguous, (X,), [S(2, 3)], ops=set())
case("detach", T.detach, (X,), [S(3)], ops=set())
case("tril", torch.tril, (X,), [S(3, 4)], ops={"tril"})
case("tril-batched", T.tril, (X, -1), [S(2, 4, 4)], ops={"tril"})
case("triu", torch.triu, (X, 1), [S(4, 3)], ops={"triu"})
case("triu-method", T.triu, (X,), [S(2, 3, 3, dtype=torch.int64)], ops={"triu"})

# -- indexing, joining, splitting ----------------------------------------------------------------
case("getitem-int", T.__getitem__, (X, 0), [S(3, 4)], ops={"select"})
case("getitem-neg-int", T.__getitem__, (X, (slice(None), -1)), [S(3, 4)], ops={"select"})
case("getitem-slices", T.__getitem__, (X, (slice(None), slice(1, -1))), [S(3, 5)], ops={"slice"})
case(
    "getitem-ellipsis-none-step",
    T.__getitem__,
    (X, (Ellipsis, None, slice(None, None, 2))),
    [S(2, 3, 5)],
    ops={"unsqueeze", "slice"},
)
case(
    "getitem-mixed",
    T.__getitem__,
    (X, (slice(1, None), None, 0)),
    [S(4, 3, 2)],
    ops={"slice", "unsqueeze", "select"},
)
case(
    "getitem-symbolic-stop",
    T.__getitem__,
    (X, (slice(None), slice(None, Sz(lambda s: s[1][0])))),
    [S(2, 6), S(4)],
    ops={"slice"},
)
case(
    "getitem-symbolic-neg-start",
    T.__getitem__,
    (X, (Ellipsis, slice(Sz(lambda s: -s[1][0]), None))),
    [S(2, 6), S(2)],
    ops={"slice"},
)
case("getitem-clamped", T.__getitem__, (X, slice(-10, 10)), [S(3, 2)], ops={"slice"})
case("getitem-empty-slice", T.__getitem__, (X, slice(3, 1)), [S(4)], ops={"slice"})
case("getitem-full", T.__getitem__, (X, (slice(None), Ellipsis)), [S(2, 3)], ops=set())
case("select", torch.select, (X, 1, -1), [S(2, 3)], ops={"select"})
case("select-method", T.select, (X, 0, 2), [S(4, 2, 2)], ops={"select"})
case("narrow", T.narrow, (X, 1, 1, 2), [S(2, 5)], ops={"slice"})
case("narrow-neg", torch.narrow, (X, 0, -2, 2), [S(4, 3)], ops={"slice"})
case("unbind", T.unbind, (X, 1), [S(2, 3)], ops={"select"})
case("unbind-0", torch.unbind, (X,), [S(2, 2, 1)], ops={"select"})
case("cat", torch.cat, ([X, Y], 1), [S(2, 3), S(2, 4)], ops={"cat"})
case("cat-promote", torch.cat, ((X, Y, X),), [S(1, 2, dtype=torch.float16), S(3, 2)], ops={"cat"})
case("concat", torch.concat, ([X, Y],), [S(2, 3), S(1, 3)], dim=-2, ops={"cat"})
case("stack", torch.stack, ([X, Y],), [S(2, 3), S(2, 3)], ops={"unsqueeze", "cat"})
case("stack-last", torch.stack, ((X, X, Y), -1), [S(3), S(3)], ops={"unsqueeze", "cat"})
case("split", torch.split, (X, 2), [S(5, 3)], ops={"split"})
case("split-method-dim", T.split, (X, 4, 1), [S(2, 8)], ops={"split"})
case("split-sizes", T.split, (X, [1, 3], -1), [S(2, 4)], ops={"split"})
case("split_with_sizes", torch.split_with_sizes, (X, (2, 1)), [S(3, 2)], ops={"split"})
case("chunk", T.chunk, (X, 3, 1), [S(2, 7)], ops={"split"})
case("chunk-fewer", torch.chunk, (X, 4), [S(6, 2)], ops={"split"})
case("chunk-even", T.chunk, (X, 2, -1), [S(3, 8)], ops={"split"})

# -- factories -----------------------------------------------------------------------------------
case("arange", torch.arange, (Sz(lambda s: s[0][0]),), [S(5)], ops={"arange"})
case("arange-step", torch.arange, (1, Sz(lambda s: s[0][1]), 2), [S(2, 9)], ops={"arange"})
case("arange-float", torch.arange, (0.0, 2.5, 0.5), [], ops={"arange"})
case("arange-dtype", torch.arange, (5,), [], dtype=torch.float32, ops={"arange"})
case("arange-negative-step", torch.arange, (Sz(lambda s: s[0][0]), 0, -2), [S(7)], ops={"arange"})
case("zeros", torch.zeros, (Sz(lambda s: s[0][0]), 3), [S(4)], ops={"full"})
case("zeros-tuple", torch.zeros, (Sz(lambda s: tuple(s[0])),), [S(2, 3)], dtype=torch.int32, ops={"full"})
case("ones", torch.ones, (2, 3), [], ops={"full"})
case("ones-size-kw", torch.ones, (), [], size=(3,), dtype=torch.float64, ops={"full"})
case("full", torch.full, ((Sz(lambda s: s[0][0]), 2), 1.5), [S(3)], ops={"full"})
case("full-bool", torch.full, ((2,), True), [], ops={"full"})
case("full-int", torch.full, ((1, 3), 7), [], ops={"full"})
case("empty", torch.empty, (2, Sz(lambda s: s[0][0])), [S(3)], check="shape", ops={"full"})
case("zeros_like", torch.zeros_like, (X,), [S(2, 3)], ops={"full"})
case(
    "ones_like-dtype", torch.ones_like, (X,), [S(3, 1, dtype=torch.int64)], dtype=torch.float64, ops={"full"}
)
case("full_like", torch.full_like, (X, 7), [S(2, 2)], ops={"full"})
case("full_like-int-float", torch.full_like, (X, 2.5), [S(3, dtype=torch.int32)], ops={"full"})
case("empty_like", torch.empty_like, (X,), [S(2, 3)], check="shape", ops={"full"})
case("new_zeros", T.new_zeros, (X, (Sz(lambda s: s[0][1]), 2)), [S(2, 3, dtype=torch.float16)], ops={"full"})
case("new_ones", T.new_ones, (X, 2, 3), [S(1, dtype=torch.int64)], ops={"full"})
case("new_full", T.new_full, (X, (2, 3), 3.0), [S(4)], ops={"full"})
case("new_empty", T.new_empty, (X, (3,)), [S(2)], check="shape", ops={"full"})
