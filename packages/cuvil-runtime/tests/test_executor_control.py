"""The reference executor on control flow (if / for / while) against eager Python.

The graphs are built by hand in the forms the frontend emits (most are the shared
ones of :mod:`cuvil_ir.testing`); each runs at several input sizes, taking each
branch and different trip counts (zero too).
"""

from __future__ import annotations

import time

import pytest
import sympy
import torch

from cuvil_ir import DType, Graph, ScalarKind, ScalarType, TensorType, parse_graph, symbol, verify
from cuvil_ir.testing import (
    LOOP_INDEX,
    X0,
    GraphBuilder,
    f32,
    for_loop,
    if_symbolic,
    if_tensor,
    sum0,
    while_loop,
)
from cuvil_runtime.executor import Interpreter

I = LOOP_INDEX  # noqa: E741  (the loop index, as in the IR text)
J = symbol("j")
INT = ScalarType(ScalarKind.int)


def run_both(g: Graph) -> list[Interpreter]:
    """The graph (verified), and the graph read back from its text: both must run the same."""
    verify(g)
    return [Interpreter(g), Interpreter(verify(parse_graph(g.text)))]


# -- if -----------------------------------------------------------------------------------
def test_if_on_a_size_predicate_takes_each_branch() -> None:
    # x[:2] if x.shape[0] > 2 else -x
    for run in run_both(if_symbolic()):
        for n in (5, 2, 3, 0):
            xt = torch.randn(n, 4)
            (got,) = run(xt)
            torch.testing.assert_close(got, xt[:2] if n > 2 else -xt)


def test_if_on_a_tensor_returns_what_eager_returns() -> None:
    # x * 2 if x.sum() > 0 else x; the sum is an output too
    g = if_tensor()
    total = next(n for n in g.nodes if n.op == "sum").outputs[0]
    for run in run_both(g.replace(outputs=(*g.outputs, total))):
        for n, sign in ((3, 1.0), (6, -1.0)):
            xt = torch.rand(n, 4) * sign
            got, s = run(xt)
            if xt.sum() > 0:
                torch.testing.assert_close(got, xt * 2)
            else:
                assert got is xt  # the else branch yields the input itself, as eager code does
            torch.testing.assert_close(s, xt.sum())


def test_if_on_a_one_element_int_tensor() -> None:
    g = GraphBuilder(("x", f32(X0)), ("k", TensorType(DType.i64, (1,))))
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
    for run in run_both(for_loop(*bounds)):
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
    g = GraphBuilder(("x", f32(X0, 4)))
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
    g = GraphBuilder(("x", f32(3, 4)))
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
    g = GraphBuilder(("x", f32(X0, 4)))
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
    # c = x.sum() * 0; while (x * x).sum() >= 1: x = x * 0.5; c = c + 1
    def eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = x.sum() * 0.0
        while (x * x).sum() >= 1:
            x = x * 0.5
            c = c + 1
        return x, c

    for run in run_both(while_loop()):
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
    g = GraphBuilder(("x", f32(X0)))
    v = g.args[0]
    for _ in range(2000):
        v = g("neg", (v,), f32(X0))
    run = Interpreter(verify(g.graph(v)))
    xt = torch.randn(4)
    run(xt)
    t0 = time.perf_counter()
    (out,) = run(xt)
    assert time.perf_counter() - t0 < 2.0
    torch.testing.assert_close(out, xt)
