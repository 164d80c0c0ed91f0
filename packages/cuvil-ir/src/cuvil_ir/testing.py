"""Test helpers for op authors and backends.

Plain Python on top of :mod:`cuvil_ir` (no test framework): failed checks raise
``AssertionError`` with a message, so the helpers work under pytest or anywhere else.

**Checking an op against torch.** An :class:`OpCase` is one torch call on example
tensors described by :class:`TensorSpec` (inputs appear in the call as :class:`In`,
sizes computed from input shapes as :class:`Sz`). :func:`capture` records the call
through the op registry's capture rule with a :class:`RecordingEmitter`, every input
size a symbol; :func:`check_case` then checks that

1. the inferred output types equal the types torch's fake kernels compute for the
   same call under the same symbolic sizes (:func:`cuvil_ir.graph_ir.fake.fake_call`);
2. the emitted ops' ``reference`` functions, run on the example tensors, give what
   the eager torch call gives (exact dtype);
3. a graph of the emitted nodes verifies, and print -> parse -> print gives the same
   text.

A table of cases::

    from cuvil_ir.testing import CaseTable, In, check_case, spec

    CASES = CaseTable()
    CASES.add("gelu-tanh", F.gelu, (In(0),), [spec(2, 3)], approximate="tanh", ops={"gelu"})
    for c in CASES:
        check_case(c)

**Control flow by hand.** :class:`GraphBuilder` appends nodes to a graph or a region;
:func:`if_symbolic`, :func:`if_tensor`, :func:`for_loop`, :func:`for_with_if` and
:func:`while_loop` build ``if``/``for``/``while`` graphs in the exact forms the
frontend emits (see :mod:`cuvil_ir.graph_ir.ops.control`), for verifier, printer
and executor tests (:data:`CONTROL_FLOW_GRAPHS` names them all).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import sympy
import torch
from torch.utils import _pytree as pytree

from cuvil_ir.graph_ir.fake import fake_call
from cuvil_ir.graph_ir.nodes import KV, Block, Graph, Node, Ref, Value
from cuvil_ir.graph_ir.parser import parse_graph
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.graph_ir.verifier import verify
from cuvil_ir.symbolic import ShapeContext, evaluate, evaluate_bool, symbol

__all__ = [
    "CONTROL_FLOW_GRAPHS",
    "CaseTable",
    "Captured",
    "GraphBuilder",
    "Handle",
    "In",
    "LOOP_INDEX",
    "OpCase",
    "RecordingEmitter",
    "Sz",
    "TensorSpec",
    "X0",
    "capture",
    "check_case",
    "f32",
    "flag",
    "for_loop",
    "for_with_if",
    "if_symbolic",
    "if_tensor",
    "spec",
    "sum0",
    "while_loop",
]


# == capturing one torch call ==================================================================
class Handle:
    """A traced value: its IR value and an example tensor (or scalar) computed eagerly."""

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


class RecordingEmitter:
    """A minimal :class:`cuvil_ir.Emitter` for capture rules: records nodes in :attr:`nodes`.

    Each emitted op's ``reference`` runs at once on the operands' examples (every size
    expression in its attributes evaluated at ``hints``), so every :class:`Handle` carries
    the value the op computes. Attribute names must match the op's schema exactly.
    """

    def __init__(self, hints: dict[sympy.Symbol, int]) -> None:
        self.ctx = ShapeContext(hints)
        self.nodes: list[Node] = []
        self._n = 0

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        """The example value of every size symbol."""
        assert self.ctx.hints is not None
        return self.ctx.hints

    def _fresh(self, t: Type) -> Value:
        self._n += 1
        return Value(f"t{self._n}", t)

    def _operand(self, h: Any) -> tuple[Value, Any]:
        if isinstance(h, Handle):
            return h.value, h.example
        assert isinstance(h, (bool, int, float, sympy.Basic)), f"cannot use {h!r} as an operand"
        v = self._fresh(ScalarType(ScalarKind.of(h)))
        self.nodes.append(Node("const", (), (v,), (("value", h),)))
        return v, _evaluate_attr(h, self.hints)

    def emit(self, op: str, inputs: Any, **attrs: Any) -> Any:
        opdef = REGISTRY.get(op)
        assert set(attrs) == set(opdef.attr_names), f"{op}: attributes {sorted(attrs)} vs {opdef.attr_names}"
        for v in attrs.values():
            _check_attr(v)
        operands = [self._operand(h) for h in inputs]
        types = infer_types(opdef, self.ctx, [v.type for v, _ in operands], attrs)
        outs = tuple(self._fresh(t) for t in types)
        self.nodes.append(Node(op, tuple(v for v, _ in operands), outs, tuple(attrs.items())))
        concrete = {k: _evaluate_attr(v, self.hints) for k, v in attrs.items()}
        result = opdef.reference(*[e for _, e in operands], **concrete)
        results = result if isinstance(result, tuple) else (result,)
        assert len(results) == len(outs), (
            f"{op}: reference gave {len(results)} values for {len(outs)} outputs"
        )
        handles = [Handle(v, r) for v, r in zip(outs, results)]
        return handles[0] if opdef.num_outputs == 1 else tuple(handles)

    def type_of(self, h: Any) -> Type:
        if isinstance(h, Handle):
            return h.value.type
        return ScalarType(ScalarKind.of(h))

    def is_value(self, h: Any) -> bool:
        return isinstance(h, Handle)

    def rebind(self, target: Handle, result: Handle) -> Handle:
        target.value, target.example = result.value, result.example
        return target


# -- cases ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class In:
    """The i-th input tensor, in the arguments of an :class:`OpCase`."""

    i: int


@dataclass(frozen=True)
class Sz:
    """A size computed from the input shapes (sympy, torch SymInt or int, per mode)."""

    f: Callable[[list[Any]], Any]


@dataclass(frozen=True)
class TensorSpec:
    """An input tensor of an :class:`OpCase`: random values of this shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    static: bool = False  # parameters have static sizes, as the frontend lifts them
    low: int = -5  # integer tensors are drawn from [low, high)
    high: int = 5


def spec(
    *shape: int, dtype: torch.dtype = torch.float32, static: bool = False, low: int = -5, high: int = 5
) -> TensorSpec:
    """A :class:`TensorSpec` of ``shape``."""
    return TensorSpec(shape, dtype, static, low, high)


@dataclass
class OpCase:
    """One torch call: ``fn(*args, **kwargs)`` on tensors made from ``inputs``.

    ``check`` says how to compare values: ``"exact"`` (up to 1e-5 for floats),
    ``"dropout"`` (each kept element scaled by ``1 / (1 - args[1])``) or ``"shape"``
    (values unspecified, as of ``torch.empty``). ``ops``, when set, are exactly the
    ops the capture must emit (besides ``const``).
    """

    id: str
    fn: Any
    args: tuple[Any, ...]
    inputs: tuple[TensorSpec, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    check: str = "exact"  # "exact" | "dropout" | "shape" (values unspecified)
    ops: frozenset[str] | None = None  # exactly these ops must be emitted (besides const)


class CaseTable(list[OpCase]):
    """A list of :class:`OpCase`, filled by :meth:`add`."""

    def add(
        self,
        id: str,
        fn: Any,
        args: tuple[Any, ...],
        inputs: list[TensorSpec],
        /,
        check: str = "exact",
        ops: set[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append a case; ``kwargs`` are the keyword arguments of the torch call."""
        self.append(
            OpCase(id, fn, args, tuple(inputs), kwargs, check, None if ops is None else frozenset(ops))
        )


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
def _example(s: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    if s.dtype.is_floating_point:
        return torch.randn(s.shape, generator=gen).to(s.dtype)
    if s.dtype == torch.bool:
        return torch.randint(0, 2, s.shape, generator=gen).bool()
    return torch.randint(s.low, s.high, s.shape, generator=gen).to(s.dtype)


def _inputs(c: OpCase) -> tuple[list[torch.Tensor], list[Value], dict[sympy.Symbol, int]]:
    gen = torch.Generator().manual_seed(sum(map(ord, c.id)))
    examples: list[torch.Tensor] = []
    values: list[Value] = []
    hints: dict[sympy.Symbol, int] = {}
    for i, s in enumerate(c.inputs):
        ex = _example(s, gen)
        dims: list[Any] = []
        for d, size in enumerate(s.shape):
            if s.static:
                dims.append(size)
            else:
                sym = symbol(f"{'abcdefgh'[i]}{d}")
                hints[sym] = size
                dims.append(sym)
        examples.append(ex)
        values.append(Value("xyzwuvpq"[i], TensorType(DType.from_torch(s.dtype), tuple(dims), "cpu")))
    return examples, values, hints


class Captured(NamedTuple):
    """What :func:`capture` recorded."""

    emitter: RecordingEmitter  #: its ``nodes`` are the emitted nodes
    inputs: list[Value]  #: the graph inputs (sizes ``a0, a1, ...`` for input 0 ...)
    examples: list[torch.Tensor]  #: their example tensors
    result: Any  #: what the capture rule returned (handles, possibly nested)


def capture(c: OpCase) -> Captured:
    """Record ``c``'s torch call through the registry's capture rule, with symbolic sizes.

    Raises :class:`cuvil_ir.NotCaptured` where the rule declines the call.
    """
    examples, values, hints = _inputs(c)
    entry = REGISTRY.for_torch(c.fn)
    assert entry is not None, f"{c.fn} is not captured by any op"
    _, rule = entry
    em = RecordingEmitter(hints)
    handles = [Handle(v, e) for v, e in zip(values, examples)]
    shapes = [cast(TensorType, v.type).shape for v in values]
    result = rule(em, *_resolve(c.args, handles, shapes), **_resolve(c.kwargs, handles, shapes))
    return Captured(em, values, examples, result)


def _check_values(c: OpCase, got: torch.Tensor, want: torch.Tensor, x: torch.Tensor | None) -> None:
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
        assert x is not None
        p = c.args[1]
        kept = got != 0
        torch.testing.assert_close(got[kept], (x / (1 - p))[kept])
        assert 0 < kept.float().mean().item() < 1


def check_case(c: OpCase) -> None:
    """Capture ``c`` and check types, values and the graph against torch (see the module doc)."""
    em, values, examples, result = capture(c)
    outs = pytree.tree_leaves(result)
    assert outs and all(isinstance(h, Handle) for h in outs), f"capture returned {result!r}"
    emitted = {n.op for n in em.nodes} - {"const"}
    if c.ops is not None:
        assert emitted == c.ops, f"emitted {sorted(emitted)}, expected {sorted(c.ops)}"

    # (1) types: ours against torch's fake kernels on the same symbolic sizes
    fctx = ShapeContext(em.hints)

    def call(*tensors: Any) -> Any:
        shapes = [x.shape for x in tensors]
        return c.fn(*_resolve(c.args, list(tensors), shapes), **_resolve(c.kwargs, list(tensors), shapes))

    fake_types, _ = fake_call(
        fctx, call, [v.type for v in values], tuple(Ref(i) for i in range(len(values))), KV.of({}), c.id
    )
    assert len(fake_types) == len(outs), f"torch gives {len(fake_types)} outputs, the capture {len(outs)}"
    facts = em.ctx.assumptions + fctx.assumptions
    for h, ft in zip(outs, fake_types):
        assert _types_agree(h.value.type, cast(TensorType, ft), facts, em.hints), (
            f"ours {h.value.type}, torch {ft}"
        )

    # (2) values: the references against eager torch
    eager = pytree.tree_leaves(call(*examples))
    assert len(eager) == len(outs), f"eager torch gives {len(eager)} outputs, the capture {len(outs)}"
    for h, want in zip(outs, eager):
        assert [evaluate(d, em.hints) for d in h.value.type.shape] == list(want.shape)
        _check_values(c, h.example, want, examples[0] if examples else None)

    # (3) the graph verifies and survives print -> parse -> print
    g = Graph("f", tuple(values), tuple(em.nodes), tuple(h.value for h in outs), tuple(em.ctx.assumptions))
    verify(g)
    back = parse_graph(str(g))
    assert back.text == g.text
    verify(back)


# == hand-built control flow ===================================================================
X0 = symbol("x_0")  #: the first size of the input ``x`` of the graphs below
LOOP_INDEX = symbol("i")  #: the index of their ``for`` loops, as in the IR text
_INT = ScalarType(ScalarKind.int)


def f32(*shape: Any) -> TensorType:
    """``Tensor[f32, shape, cpu]``."""
    return TensorType(DType.f32, shape)


def flag(*shape: Any) -> TensorType:
    """``Tensor[bool, shape, cpu]``."""
    return TensorType(DType.bool, shape)


class GraphBuilder:
    """Appends nodes to a graph or a block; results get unique names across regions.

    ``b(op, inputs, *result_types, **attrs)`` appends a node and returns its result
    (or the tuple of its results); :meth:`node` also takes regions. :meth:`region`
    starts a block whose arguments have the given types. Nothing is verified here.
    """

    def __init__(self, *args: tuple[str, Type], names: list[int] | None = None) -> None:
        self.args = tuple(Value(n, t) for n, t in args)
        self.nodes: list[Node] = []
        self._names = names if names is not None else [0]

    def _fresh(self, t: Type) -> Value:
        self._names[0] += 1
        return Value(f"v{self._names[0]}", t)

    def __call__(self, op: str, inputs: tuple[Value, ...], *types: Type, **attrs: Any) -> Any:
        return self.node(op, inputs, types, attrs)

    def node(
        self,
        op: str,
        inputs: tuple[Value, ...],
        types: tuple[Type, ...],
        attrs: dict[str, Any] | None = None,
        regions: tuple[Block, ...] = (),
    ) -> Any:
        outs = tuple(self._fresh(t) for t in types)
        self.nodes.append(Node(op, inputs, outs, tuple((attrs or {}).items()), regions))
        return outs[0] if len(outs) == 1 else outs

    def const(self, value: Any) -> Value:
        """A ``const`` node of a Python scalar or a sympy expression or relation."""
        kind = ScalarKind.of(value)
        return cast(Value, self("const", (), ScalarType(kind), value=value))

    def region(self, *arg_types: Type) -> GraphBuilder:
        """A builder for a block nested here, sharing this builder's value names."""
        b = GraphBuilder(names=self._names)
        b.args = tuple(b._fresh(t) for t in arg_types)
        return b

    def block(self, *results: Value) -> Block:
        return Block(self.args, tuple(self.nodes), results)

    def graph(self, *outputs: Value) -> Graph:
        """The graph ``f`` of this builder's arguments and nodes (not verified)."""
        return Graph("f", self.args, tuple(self.nodes), outputs)


def sum0(b: GraphBuilder, x: Value, t: Type) -> Value:
    """``x.sum(0)``, of type ``t``."""
    return cast(Value, b("sum", (x,), t, dims=(0,), keepdim=False, dtype=None))


def if_symbolic() -> Graph:
    """``x[:2] if x.shape[0] > 2 else -x``: the result's first dim is a Piecewise."""
    g = GraphBuilder(("x", f32(X0, 4)))
    (x,) = g.args
    cond = sympy.Gt(X0, 2)
    pred = g.const(cond)
    then = g.region()
    # slicing to 2 needs 2 < x_0: the branch condition is a fact inside the branch
    head = then("slice", (x,), f32(2, 4), dim=0, start=None, end=2, step=1)
    other = g.region()
    neg = other("neg", (x,), f32(X0, 4))
    out = g.node(
        "if",
        (pred,),
        (f32(sympy.Piecewise((2, cond), (X0, True)), 4),),
        regions=(then.block(head), other.block(neg)),
    )
    return g.graph(out)


def if_tensor() -> Graph:
    """``x * 2 if x.sum() > 0 else x``; the else branch yields the graph input itself."""
    g = GraphBuilder(("x", f32(X0, 4)))
    (x,) = g.args
    total = g("sum", (x,), f32(), dims=(0, 1), keepdim=False, dtype=None)
    pred = g("gt", (total, g.const(0.0)), flag())
    two = g.const(2.0)  # defined outside, used inside a branch
    then = g.region()
    doubled = then("mul", (x, two), f32(X0, 4))
    out = g.node("if", (pred,), (f32(X0, 4),), regions=(then.block(doubled), g.region().block(x)))
    return g.graph(out)


def for_loop(start: Any = 1, stop: Any = X0, step: Any = 1) -> Graph:
    """acc = x.sum(0); y = x
    for i in range(start, stop, step): acc = acc + x[i] * i + x[:i].sum(0); y = y * 0.5"""
    i = LOOP_INDEX
    g = GraphBuilder(("x", f32(X0, 4)))
    (x,) = g.args
    bounds = tuple(g("const", (), _INT, value=v) for v in (start, stop, step))
    acc0 = sum0(g, x, f32(4))
    half = g.const(0.5)
    body = g.region(f32(4), f32(X0, 4))
    acc, y = body.args
    row = body("select", (x,), f32(4), dim=0, index=i)
    head = body("slice", (x,), f32(i, 4), dim=0, start=None, end=i, step=1)
    index = body("const", (), _INT, value=i)
    acc1 = body("add", (acc, body("mul", (row, index), f32(4))), f32(4))
    acc2 = body("add", (acc1, sum0(body, head, f32(4))), f32(4))
    y1 = body("mul", (y, half), f32(X0, 4))
    outs = g.node("for", (*bounds, acc0, x), (f32(4), f32(X0, 4)), {"var": "i"}, (body.block(acc2, y1),))
    return g.graph(*outs)


def for_with_if() -> Graph:
    """acc = x.sum(0)
    for i in range(x_0): acc = acc + x[i] if i % 2 == 0 else acc - x[i]
    (the branch condition depends on the loop index)."""
    i = LOOP_INDEX
    g = GraphBuilder(("x", f32(X0, 4)))
    (x,) = g.args
    bounds = tuple(g("const", (), _INT, value=v) for v in (0, X0, 1))
    body = g.region(f32(4))
    (acc,) = body.args
    even = body.const(sympy.Eq(sympy.Mod(i, 2), 0))
    then = body.region()
    added = then("add", (acc, then("select", (x,), f32(4), dim=0, index=i)), f32(4))
    other = body.region()
    subbed = other("sub", (acc, other("select", (x,), f32(4), dim=0, index=i)), f32(4))
    acc1 = body.node("if", (even,), (f32(4),), regions=(then.block(added), other.block(subbed)))
    out = g.node("for", (*bounds, sum0(g, x, f32(4))), (f32(4),), {"var": "i"}, (body.block(acc1),))
    return g.graph(out)


def while_loop() -> Graph:
    """c = x.sum() * 0; while (x * x).sum() >= 1: x = x * 0.5; c = c + 1"""
    g = GraphBuilder(("x", f32(X0)))
    (x,) = g.args
    one, half = g.const(1.0), g.const(0.5)
    c0 = g("mul", (g("sum", (x,), f32(), dims=(0,), keepdim=False, dtype=None), g.const(0.0)), f32())
    cond = g.region(f32(X0), f32())
    cx, _ = cond.args
    norm2 = cond("sum", (cond("mul", (cx, cx), f32(X0)),), f32(), dims=(0,), keepdim=False, dtype=None)
    pred = cond("ge", (norm2, one), flag())
    body = g.region(f32(X0), f32())
    bx, bc = body.args
    outs = g.node(
        "while",
        (x, c0),
        (f32(X0), f32()),
        regions=(
            cond.block(pred),
            body.block(body("mul", (bx, half), f32(X0)), body("add", (bc, one), f32())),
        ),
    )
    return g.graph(*outs)


#: name -> a function building a fresh graph (each call builds the same graph again)
CONTROL_FLOW_GRAPHS: dict[str, Callable[[], Graph]] = {
    "if_symbolic": if_symbolic,
    "if_tensor": if_tensor,
    "for": for_loop,
    "for_step_2": lambda: for_loop(0, X0, 2),
    "for_reversed": lambda: for_loop(X0 - 1, -1, -1),
    "for_with_if": for_with_if,
    "while": while_loop,
}
