"""The reference executor on control flow (if / for / while) against eager Python.

The graphs are built by hand in the forms the frontend emits; each runs at
several input sizes, taking each branch and different trip counts (zero too).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sympy
import torch

from cuvil_ir import (
    Block,
    DType,
    Graph,
    Node,
    ScalarKind,
    ScalarType,
    TensorType,
    Type,
    Value,
    parse_graph,
    symbol,
    verify,
)
from cuvil_runtime.executor import Interpreter

X0 = symbol("x_0")
I = symbol("i")  # noqa: E741  (the loop index, as in the IR text)
J = symbol("j")
F32 = DType.f32
INT = ScalarType(ScalarKind.int)


def f32(*shape: Any) -> TensorType:
    return TensorType(F32, shape)


def flag(*shape: Any) -> TensorType:
    return TensorType(DType.bool, shape)


class Builder:
    """Appends nodes to a graph or a block; results get unique names across regions."""

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
        return self("const", (), ScalarType(ScalarKind.of(value)), value=value)  # type: ignore[no-any-return]

    def region(self, *arg_types: Type) -> Builder:
        b = Builder(names=self._names)
        b.args = tuple(b._fresh(t) for t in arg_types)
        return b

    def block(self, *results: Value) -> Block:
        return Block(self.args, tuple(self.nodes), results)

    def graph(self, *outputs: Value) -> Graph:
        return verify(Graph("f", self.args, tuple(self.nodes), outputs))


def sum0(b: Builder, x: Value, t: Type) -> Value:
    return b("sum", (x,), t, dims=(0,), keepdim=False, dtype=None)  # type: ignore[no-any-return]


def run_both(g: Graph) -> list[Interpreter]:
    """The graph, and the graph read back from its text: both must run the same."""
    return [Interpreter(g), Interpreter(verify(parse_graph(g.text)))]


# -- if -----------------------------------------------------------------------------------
def test_if_on_a_size_predicate_takes_each_branch() -> None:
    g = Builder(("x", f32(X0, 4)))
    (x,) = g.args
    cond = sympy.Gt(X0, 2)
    then = g.region()
    head = then("slice", (x,), f32(2, 4), dim=0, start=None, end=2, step=1)
    other = g.region()
    neg = other("neg", (x,), f32(X0, 4))
    out = g.node(
        "if",
        (g.const(cond),),
        (f32(sympy.Piecewise((2, cond), (X0, True)), 4),),
        regions=(then.block(head), other.block(neg)),
    )
    for run in run_both(g.graph(out)):
        for n in (5, 2, 3, 0):
            xt = torch.randn(n, 4)
            (got,) = run(xt)
            torch.testing.assert_close(got, xt[:2] if n > 2 else -xt)


def test_if_on_a_tensor_returns_what_eager_returns() -> None:
    g = Builder(("x", f32(X0, 4)))
    (x,) = g.args
    total = g("sum", (x,), f32(), dims=(0, 1), keepdim=False, dtype=None)
    pred = g("gt", (total, g.const(0.0)), flag())
    two = g.const(2.0)
    then = g.region()
    doubled = then("mul", (x, two), f32(X0, 4))
    out = g.node("if", (pred,), (f32(X0, 4),), regions=(then.block(doubled), g.region().block(x)))
    for run in run_both(g.graph(out, total)):
        for n, sign in ((3, 1.0), (6, -1.0)):
            xt = torch.rand(n, 4) * sign
            got, s = run(xt)
            if xt.sum() > 0:
                torch.testing.assert_close(got, xt * 2)
            else:
                assert got is xt  # the else branch yields the input itself, as eager code does
            torch.testing.assert_close(s, xt.sum())


def test_if_on_a_one_element_int_tensor() -> None:
    g = Builder(("x", f32(X0)), ("k", TensorType(DType.i64, (1,))))
    x, k = g.args
    then = g.region()
    other = g.region()
    out = g.node(
        "if",
        (k,),
        (f32(X0),),
        regions=(then.block(then("relu", (x,), f32(X0))), other.block(other("neg", (x,), f32(X0)))),
    )
    (run, _) = run_both(g.graph(out))
    xt = torch.randn(4)
    torch.testing.assert_close(run(xt, torch.tensor([3]))[0], xt.relu())
    torch.testing.assert_close(run(xt, torch.tensor([0]))[0], -xt)


# -- for ----------------------------------------------------------------------------------
def for_graph(start: Any, stop: Any, step: Any) -> Graph:
    g = Builder(("x", f32(X0, 4)))
    (x,) = g.args
    bounds = tuple(g("const", (), INT, value=v) for v in (start, stop, step))
    acc0 = sum0(g, x, f32(4))
    half = g.const(0.5)
    body = g.region(f32(4), f32(X0, 4))
    acc, y = body.args
    row = body("select", (x,), f32(4), dim=0, index=I)
    head = body("slice", (x,), f32(I, 4), dim=0, start=None, end=I, step=1)
    index = body("const", (), INT, value=I)
    acc1 = body("add", (acc, body("mul", (row, index), f32(4))), f32(4))
    acc2 = body("add", (acc1, sum0(body, head, f32(4))), f32(4))
    y1 = body("mul", (y, half), f32(X0, 4))
    outs = g.node("for", (*bounds, acc0, x), (f32(4), f32(X0, 4)), {"var": "i"}, (body.block(acc2, y1),))
    return g.graph(*outs)


def eager_for(x: torch.Tensor, r: range) -> tuple[torch.Tensor, torch.Tensor]:
    acc, y = x.sum(0), x
    for i in r:
        acc = acc + x[i] * i + x[:i].sum(0)
        y = y * 0.5
    return acc, y


FOR_CASES = {
    "range(1, n)": ((1, X0, 1), lambda n: range(1, n)),
    "range(0, n, 2)": ((0, X0, 2), lambda n: range(0, n, 2)),
    "range(n - 1, -1, -1)": ((X0 - 1, -1, -1), lambda n: range(n - 1, -1, -1)),
}


@pytest.mark.parametrize("case", sorted(FOR_CASES))
def test_for_with_a_symbolic_trip_count(case: str) -> None:
    bounds, rng = FOR_CASES[case]
    for run in run_both(for_graph(*bounds)):
        for n in (1, 5, 0, 2, 5):  # 5 again: attributes memoised per iteration are reused
            xt = torch.randn(n, 4)
            acc, y = run(xt)
            want_acc, want_y = eager_for(xt, rng(n))
            torch.testing.assert_close(acc, want_acc)
            torch.testing.assert_close(y, want_y)
            if len(rng(n)) == 0:
                assert y is xt  # zero iterations: the initial values come out


def test_nested_loops_and_an_if_on_the_loop_index() -> None:
    """for i in range(n): for j in range(i): acc = acc + x[i] * j if (i + j) % 2 == 0 else acc - x[i]"""
    g = Builder(("x", f32(X0, 4)))
    (x,) = g.args
    outer = g.region(f32(4))
    (acc,) = outer.args
    inner = outer.region(f32(4))
    (acc_in,) = inner.args
    then = inner.region()
    scaled = then("mul", (then("select", (x,), f32(4), dim=0, index=I), then.const(J)), f32(4))
    added = then("add", (acc_in, scaled), f32(4))
    other = inner.region()
    subbed = other("sub", (acc_in, other("select", (x,), f32(4), dim=0, index=I)), f32(4))
    even = inner.const(sympy.Eq(sympy.Mod(I + J, 2), 0))
    acc_in1 = inner.node("if", (even,), (f32(4),), regions=(then.block(added), other.block(subbed)))
    inner_bounds = tuple(outer("const", (), INT, value=v) for v in (0, I, 1))
    acc1 = outer.node("for", (*inner_bounds, acc), (f32(4),), {"var": "j"}, (inner.block(acc_in1),))
    bounds = tuple(g("const", (), INT, value=v) for v in (0, X0, 1))
    out = g.node("for", (*bounds, sum0(g, x, f32(4))), (f32(4),), {"var": "i"}, (outer.block(acc1),))

    def eager(x: torch.Tensor) -> torch.Tensor:
        acc = x.sum(0)
        for i in range(x.shape[0]):
            for j in range(i):
                acc = acc + x[i] * j if (i + j) % 2 == 0 else acc - x[i]
        return acc

    for run in run_both(g.graph(out)):
        for n in (4, 7, 1):
            xt = torch.randn(n, 4)
            torch.testing.assert_close(run(xt)[0], eager(xt))


def test_for_with_static_bounds_and_no_size_symbols() -> None:
    g = Builder(("x", f32(3, 4)))
    (x,) = g.args
    bounds = tuple(g("const", (), INT, value=v) for v in (0, 3, 1))
    body = g.region(f32(4))
    row = body("select", (x,), f32(4), dim=0, index=I)
    acc = body("add", (body.args[0], row), f32(4))
    out = g.node("for", (*bounds, sum0(g, x, f32(4))), (f32(4),), {"var": "i"}, (body.block(acc),))
    (run, _) = run_both(g.graph(out))
    xt = torch.randn(3, 4)
    torch.testing.assert_close(run(xt)[0], xt.sum(0) * 2)


def test_errors_in_a_body_name_the_node_and_the_loop() -> None:
    g = Builder(("x", f32(X0, 4)))
    (x,) = g.args
    bounds = tuple(g("const", (), INT, value=v) for v in (0, X0, 1))
    body = g.region(f32(4))
    bad = body("extern", (x,), f32(4), target="torch.Tensor.reshape", args=(), kwargs=None, mutates=None)
    out = g.node("for", (*bounds, sum0(g, x, f32(4))), (f32(4),), {"var": "i"}, (body.block(bad),))
    run = Interpreter(Graph("f", g.args, tuple(g.nodes), (out,)))  # not verified: a bad extern
    with pytest.raises(Exception) as err:
        run(torch.randn(2, 4))
    notes = getattr(err.value, "__notes__", [])
    assert any("while running extern" in n for n in notes) and any("while running for" in n for n in notes)


# -- while --------------------------------------------------------------------------------
def test_while_halves_until_small() -> None:
    g = Builder(("x", f32(X0)))
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

    def eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = x.sum() * 0.0
        while (x * x).sum() >= 1:
            x = x * 0.5
            c = c + 1
        return x, c

    for run in run_both(g.graph(*outs)):
        for xt in (torch.randn(6) * 10, torch.full((3,), 0.1), torch.randn(9) * 1000):
            y, c = run(xt)
            want_y, want_c = eager(xt)
            torch.testing.assert_close(y, want_y)
            torch.testing.assert_close(c, want_c)
            if want_c == 0:
                assert y is xt


# -- the straight-line path stays fast ----------------------------------------------------------
def test_straight_line_graphs_do_not_slow_down() -> None:
    # Not a benchmark: a guard against per-step work growing with control-flow support
    # (each step of 2000 cheap ops must stay far below a millisecond).
    g = Builder(("x", f32(X0)))
    v = g.args[0]
    for _ in range(2000):
        v = g("neg", (v,), f32(X0))
    run = Interpreter(g.graph(v))
    xt = torch.randn(4)
    run(xt)
    t0 = time.perf_counter()
    (out,) = run(xt)
    assert time.perf_counter() - t0 < 2.0
    torch.testing.assert_close(out, xt)
