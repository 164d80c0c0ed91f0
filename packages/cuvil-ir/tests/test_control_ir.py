"""Structured control flow in Graph IR: if / for / while verify, print, parse and hash.

Graphs are built by hand in the exact forms the frontend emits (see
:mod:`cuvil_ir.graph_ir.ops.control`), by the builders in :mod:`cuvil_ir.testing`.
Relations are never written as text here: their printed form belongs to the printer.
"""

from __future__ import annotations

from typing import Any

import pytest
import sympy

from cuvil_ir import (
    Block,
    DType,
    Graph,
    Node,
    ScalarKind,
    ScalarType,
    TensorType,
    Value,
    VerifyError,
    parse_graph,
    print_graph,
    verify,
)
from cuvil_ir.graph_ir.verifier import block_symbols
from cuvil_ir.testing import (
    CONTROL_FLOW_GRAPHS,
    LOOP_INDEX,
    X0,
    GraphBuilder,
    f32,
    for_loop,
    if_symbolic,
    if_tensor,
    while_loop,
)

I = LOOP_INDEX  # noqa: E741  (the loop index, as in the IR text)
FLOAT = ScalarType(ScalarKind.float)

# the graphs (the executor tests run them too)
GRAPHS = CONTROL_FLOW_GRAPHS


# -- positive tests -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_verifies_and_round_trips(name: str) -> None:
    g = verify(GRAPHS[name]())
    text = print_graph(g, locations=False)
    back = verify(parse_graph(text))
    assert print_graph(back, locations=False) == text
    assert back.hash == g.hash
    # the hash covers the canonical text: value names do not matter, and rebuilding gives it again
    assert GRAPHS[name]().hash == g.hash
    renamed = parse_graph(print_graph(g, canonical=False))
    assert renamed.hash == g.hash
    assert len(list(back.walk())) == len(list(g.walk()))


def test_distinct_graphs_hash_differently() -> None:
    hashes = {name: make().hash for name, make in GRAPHS.items()}
    assert len(set(hashes.values())) == len(hashes)


def test_text_shows_the_regions() -> None:
    text = for_loop().text
    assert "for(%" in text and '{var = "i"} (' in text
    assert "^0(%" in text and "yield %" in text
    w = while_loop().text
    assert w.count("^0(") == 1 and w.count("^1(") == 1
    s = if_symbolic().text
    assert "Piecewise" in s and "^1() {" in s


def test_the_loop_index_is_bound_only_in_the_body() -> None:
    g = for_loop()
    (loop,) = [n for n in g.nodes if n.op == "for"]
    assert I in block_symbols(loop.regions[0])
    assert I not in g.symbols


# -- negative tests -----------------------------------------------------------------------
def _rebuild_top(g: Graph, index: int, **changes: Any) -> Graph:
    nodes = list(g.nodes)
    nodes[index] = nodes[index].replace(**changes)
    return g.replace(nodes=tuple(nodes))


def _find(g: Graph, op: str) -> int:
    return next(k for k, n in enumerate(g.nodes) if n.op == op)


def test_yield_count_mismatch() -> None:
    g = if_tensor()
    k = _find(g, "if")
    then, other = g.nodes[k].regions
    bad = _rebuild_top(g, k, regions=(then.replace(results=then.results * 2), other))
    with pytest.raises(VerifyError, match="the then branch yields 2 values for 1 results"):
        verify(bad)
    g = for_loop()
    k = _find(g, "for")
    (body,) = g.nodes[k].regions
    with pytest.raises(VerifyError, match="body yield: expected 2 values, got 1"):
        verify(_rebuild_top(g, k, regions=(body.replace(results=body.results[:1]),)))


def test_branch_type_mismatch() -> None:
    g = if_tensor()
    k = _find(g, "if")
    (x,) = g.inputs
    then, _ = g.nodes[k].regions
    # under a tensor condition, the else branch yields a tensor of another shape
    other = GraphBuilder(names=[1000])  # fresh names
    longer = other("cat", (x, x), f32(2 * X0, 4), dim=0)
    bad = _rebuild_top(g, k, regions=(then, other.block(longer)))
    with pytest.raises(VerifyError, match="does not match the branches' Tensor.* and Tensor"):
        verify(bad)
    # ... where a Piecewise result is not allowed either (no size predicate)
    pw = Value("o", f32(sympy.Piecewise((X0, sympy.Gt(X0, 2)), (2 * X0, True)), 4))
    with pytest.raises(VerifyError, match="does not match the branches"):
        verify(_rebuild_top(bad, k, outputs=(pw,)).replace(outputs=(pw,)))
    # a dtype mismatch
    g = if_symbolic()
    k = _find(g, "if")
    out = g.nodes[k].outputs[0]
    wrong = Value(out.name, TensorType(DType.f64, out.type.shape))  # type: ignore[union-attr]
    with pytest.raises(VerifyError, match="result #0 has type Tensor\\[f64"):
        verify(_rebuild_top(g, k, outputs=(wrong,)).replace(outputs=(wrong,)))
    # a scalar where the branches yield tensors
    s = Value(out.name, FLOAT)
    with pytest.raises(VerifyError, match="result #0 has type Scalar\\[float\\]"):
        verify(_rebuild_top(g, k, outputs=(s,)).replace(outputs=(s,)))


def test_wrong_piecewise_is_rejected() -> None:
    g = if_symbolic()
    k = _find(g, "if")
    out = g.nodes[k].outputs[0]
    swapped = Value(out.name, f32(sympy.Piecewise((X0, sympy.Gt(X0, 2)), (2, True)), 4))
    with pytest.raises(VerifyError, match="Piecewise"):
        verify(_rebuild_top(g, k, outputs=(swapped,)).replace(outputs=(swapped,)))


def test_the_branch_condition_is_a_fact_only_in_its_branch() -> None:
    g = if_symbolic()
    k = _find(g, "if")
    then, other = g.nodes[k].regions
    # x[:2] is (2, 4) when 2 < x_0 (the then branch); in the else branch x_0 <= 2 holds,
    # so there the same slice is (x_0, 4)
    swapped = _rebuild_top(g, k, regions=(other, then))
    with pytest.raises(
        VerifyError, match=r"slice: result types Tensor\[f32, \(2, 4\), cpu\] do not match .* \(x_0, 4\)"
    ):
        verify(swapped)
    # under a tensor condition, neither branch knows anything about x_0
    t = if_tensor()
    pred = t.nodes[_find(t, "if")].inputs[0]
    with pytest.raises(VerifyError, match="slice: cannot decide"):
        verify(g.replace(nodes=(*t.nodes[: _find(t, "if")], g.nodes[k].replace(inputs=(pred,)))))


def test_if_condition_must_be_a_bool_or_one_element() -> None:
    g = if_tensor()
    k = _find(g, "if")
    with pytest.raises(VerifyError, match="is not a Scalar\\[bool\\] or a one-element tensor"):
        verify(_rebuild_top(g, k, inputs=g.inputs))


def test_loop_variant_carried_type() -> None:
    g = for_loop()
    k = _find(g, "for")
    (body,) = g.nodes[k].regions
    head = next(n for n in body.nodes if n.op == "slice").output  # Tensor[f32, (i, 4)]
    bad = _rebuild_top(g, k, regions=(body.replace(results=(body.results[0], head)),))
    with pytest.raises(
        VerifyError, match=r"body yield #1 .* has type Tensor\[f32, \(i, 4\), cpu\], expected"
    ):
        verify(bad)
    # a while body that grows what it carries
    g = while_loop()
    k = _find(g, "while")
    cond, body = g.nodes[k].regions
    bx = body.args[0]
    grown = Value("grown", f32(2 * X0))
    cat = Node("cat", (bx, bx), (grown,), (("dim", 0),))
    bad = _rebuild_top(
        g, k, regions=(cond, body.replace(nodes=(*body.nodes, cat), results=(grown, body.results[1])))
    )
    with pytest.raises(VerifyError, match="body yield #0"):
        verify(bad)


def test_loop_var_used_outside_the_body() -> None:
    g = for_loop()
    (x,) = g.inputs
    # in an attribute after the loop
    sel = Node("select", (x,), (Value("s", f32(4)),), (("dim", 0), ("index", I)))
    with pytest.raises(VerifyError, match=r"select: attribute 'index' uses unbound symbols \['i'\]"):
        verify(g.replace(nodes=(*g.nodes, sel)))
    # in a result type of the loop itself
    k = _find(g, "for")
    node = g.nodes[k]
    leaked = Value(node.outputs[1].name, f32(I, 4))
    with pytest.raises(VerifyError, match=r"for: result type uses unbound symbols \['i'\]"):
        verify(_rebuild_top(g, k, outputs=(node.outputs[0], leaked)))


def test_block_value_used_outside_its_block() -> None:
    g = if_tensor()
    k = _find(g, "if")
    inner = g.nodes[k].regions[0].results[0]  # defined in the then branch
    use = Node("neg", (inner,), (Value("n", f32(X0, 4)),))
    with pytest.raises(VerifyError, match="neg: operand %v\\d+ does not dominate its use"):
        verify(g.replace(nodes=(*g.nodes, use)))
    # nor may a graph return it, or the other branch yield it
    with pytest.raises(VerifyError, match="not defined"):
        verify(g.replace(outputs=(inner,)))
    then, _ = g.nodes[k].regions
    with pytest.raises(VerifyError, match="block yields %v\\d+, which is not visible there"):
        verify(_rebuild_top(g, k, regions=(then, Block((), (), (inner,)))))


def test_block_arguments_are_fresh_values() -> None:
    g = for_loop()
    k = _find(g, "for")
    (body,) = g.nodes[k].regions
    (x,) = g.inputs
    # reusing the graph input as a block argument defines it twice
    bad = _rebuild_top(g, k, regions=(body.replace(args=(body.args[0], x)),))
    with pytest.raises(VerifyError, match="block argument %x is defined twice"):
        verify(bad)


def test_loop_var_must_not_shadow_a_bound_symbol() -> None:
    g = for_loop()
    k = _find(g, "for")
    with pytest.raises(VerifyError, match="binds size symbols x_0, which are already bound"):
        verify(_rebuild_top(g, k, attrs=(("var", "x_0"),)))
    with pytest.raises(VerifyError, match="not a valid size symbol name"):
        verify(_rebuild_top(g, k, attrs=(("var", "no good"),)))


def test_loop_index_must_be_non_negative_when_used() -> None:
    with pytest.raises(VerifyError, match="the loop index i may be negative"):
        verify(for_loop(-1, X0, 1))
    with pytest.raises(VerifyError, match="the step is zero"):
        verify(for_loop(0, X0, 0))


def test_for_bounds_must_be_ints() -> None:
    g = for_loop()
    k = _find(g, "for")
    node = g.nodes[k]
    flt = Value("f", FLOAT)
    const = Node("const", (), (flt,), (("value", 1.5),))
    bad = g.replace(
        nodes=(const, *g.nodes[:k], node.replace(inputs=(flt, *node.inputs[1:])), *g.nodes[k + 1 :])
    )
    with pytest.raises(VerifyError, match="start %f must be a Scalar\\[int\\]"):
        verify(bad)


def test_while_condition_must_yield_one_predicate() -> None:
    g = while_loop()
    k = _find(g, "while")
    cond, body = g.nodes[k].regions
    with pytest.raises(VerifyError, match="the condition yields Tensor\\[f32, \\(x_0,\\), cpu\\]"):
        verify(_rebuild_top(g, k, regions=(cond.replace(results=(cond.args[0],)), body)))
    with pytest.raises(VerifyError, match="the condition yields 2 values"):
        verify(_rebuild_top(g, k, regions=(cond.replace(results=cond.results * 2), body)))
    with pytest.raises(VerifyError, match="condition argument: expected 2 values, got 1"):
        verify(_rebuild_top(g, k, regions=(cond.replace(args=cond.args[:1]), body)))


def test_region_count_and_regions_on_plain_ops() -> None:
    g = if_tensor()
    k = _find(g, "if")
    node = g.nodes[k]
    with pytest.raises(VerifyError, match="expected two regions"):
        verify(_rebuild_top(g, k, regions=node.regions[:1]))
    (x,) = g.inputs
    neg = Node("neg", (x,), (Value("n", f32(X0, 4)),), regions=(Block((), (), ()),))
    with pytest.raises(VerifyError, match="neg takes no regions"):
        verify(Graph("f", (x,), (neg,), ()))


def test_control_ops_have_no_rule_or_reference() -> None:
    from cuvil_ir import REGISTRY

    for name in ("if", "for", "while"):
        op = REGISTRY.get(name)
        assert "control_flow" in op.traits and op.num_outputs is None and op.check_regions is not None
        assert tuple(op.torch()) == ()
        with pytest.raises(NotImplementedError, match="runs them itself"):
            op.reference()
    assert REGISTRY.get("for").attr_names == ("var",)
    assert REGISTRY.get("if").attr_names == () and REGISTRY.get("while").attr_names == ()
