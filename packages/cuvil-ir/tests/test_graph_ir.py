"""Graph IR core: printing, parsing, verification, hashing, symbolic facts."""

from __future__ import annotations

import pytest
import sympy

import cuvil_ir as ir
from cuvil_ir.graph_ir.nodes import KV, Block, Ref
from cuvil_ir.symbolic import ShapeContext, UndecidableError, canonical, expr_str, parse_expr, symbol

X0, X1 = symbol("x_0"), symbol("x_1")
F32 = ir.DType.f32


def t(*shape, dtype=F32):
    return ir.TensorType(dtype, shape)


def small_graph(const=1.0, assumptions=()):
    x = ir.Value("x", t(X0, 4))
    c = ir.Value("c", ir.ScalarType(ir.ScalarKind.float))
    a = ir.Value("a", t(X0, 4))
    b = ir.Value("b", t(X0, 4))
    nodes = (
        ir.Node("const", (), (c,), (("value", const),)),
        ir.Node("add", (x, c), (a,), loc=ir.Loc("f.py", 3, 5)),
        ir.Node("relu", (a,), (b,)),
    )
    return ir.Graph("f", (x,), nodes, (b,), tuple(assumptions))


def test_print_is_canonical_and_round_trips():
    g = small_graph()
    text = str(g)
    assert 'loc("f.py":3:5)' in text
    assert "%0 = const() {value = 1.0} : Scalar[float]" in text
    assert ir.parse_graph(text).text == g.text
    assert str(ir.parse_graph(text)) == text
    assert "loc(" not in g.text


def test_value_names_do_not_change_the_hash_but_constants_do():
    g = small_graph()
    assert ir.parse_graph(g.text.replace("%0", "%k")).text == g.text  # intermediates are renumbered
    assert ir.parse_graph(g.text.replace("%0", "%k")).hash == g.hash
    assert small_graph(2.0).hash != g.hash


def test_attribute_values_round_trip():
    values = [
        None,
        True,
        -3,
        1e-05,
        float("inf"),
        float("-inf"),
        'a "quoted" string',
        ir.DType.bf16,
        (1, (2, 3), ()),
        KV.of({"b": 1, "a": Ref(0)}),
        KV((("__slice__", (None, X0 * 2, 1)),)),
        sympy.floor(X0 * X1 / 4),
    ]
    x = ir.Value("x", t(X0, X1))
    y = ir.Value("y", t(X0, X1))
    for v in values:
        node = ir.Node(
            "extern", (x,), (y,), (("args", v), ("kwargs", KV(())), ("mutates", None), ("target", "t"))
        )
        g = ir.Graph("g", (x,), (node,), (y,))
        back = ir.parse_graph(g.text)
        assert back.nodes[0].attr("args") == v, v
        assert back.text == g.text


def test_nan_and_regions_print_and_parse():
    x = ir.Value("x", t(4))
    inner = ir.Value("i", t(4))
    arg = ir.Value("arg", t(4))
    outer = ir.Value("o", t(4))
    region = Block((arg,), (ir.Node("relu", (arg,), (inner,)),), (inner,))
    node = ir.Node(
        "extern",
        (x,),
        (outer,),
        (("args", float("nan")), ("kwargs", KV(())), ("mutates", None), ("target", "t")),
        regions=(region,),
    )
    g = ir.Graph("g", (x,), (node,), (outer,))
    text = g.text
    assert "^0(%1: Tensor[f32, (4,), cpu]) {" in text and "yield %2" in text
    back = ir.parse_graph(text)
    assert back.text == text
    assert back.nodes[0].regions[0].nodes[0].op == "relu"


def test_parse_errors_point_at_the_problem():
    text = small_graph().text.replace("add(%x, %0)", "add(%x, %9)")
    with pytest.raises(ir.ParseError, match=r"line \d+:\d+: use of undefined value %9"):
        ir.parse_graph(text)
    with pytest.raises(ir.ParseError, match="defined twice"):
        ir.parse_graph(small_graph().text.replace("%2 = relu(%1)", "%1 = relu(%1)"))


def test_verifier_accepts_good_graph_and_rejects_bad_ones():
    ir.verify(small_graph())
    g = small_graph()
    # wrong result type
    bad = g.replace(nodes=(*g.nodes[:2], g.nodes[2].replace(outputs=(ir.Value("b", t(X0, 5)),))))
    with pytest.raises(ir.VerifyError, match="do not match the op's rule"):
        ir.verify(bad.replace(outputs=bad.nodes[2].outputs))
    # use before definition
    with pytest.raises(ir.VerifyError, match="does not dominate"):
        ir.verify(g.replace(nodes=(g.nodes[1], g.nodes[0], g.nodes[2])))
    # unknown attribute
    with pytest.raises(ir.VerifyError, match="not declared"):
        ir.verify(g.replace(nodes=(g.nodes[0], g.nodes[1].replace(attrs=(("alpha", 2),)), g.nodes[2])))
    # undefined output
    with pytest.raises(ir.VerifyError, match="not defined"):
        ir.verify(g.replace(outputs=(ir.Value("nope", t(4)),)))
    # unknown op
    with pytest.raises(ir.VerifyError, match="unknown Graph IR op"):
        ir.verify(g.replace(nodes=(*g.nodes[:2], g.nodes[2].replace(op="frobnicate"))))


def test_verifier_replays_shape_rules_under_the_recorded_assumptions():
    x = ir.Value("x", t(X0))
    y = ir.Value("y", t(X1))
    z = ir.Value("z", t(X0))
    node = ir.Node("add", (x, y), (z,))
    g = ir.Graph("g", (x, y), (node,), (z,))
    with pytest.raises(ir.VerifyError, match="missing assume line"):
        ir.verify(g)
    ir.verify(g.replace(assumptions=(sympy.Eq(X0, X1),)))
    assert "assume Eq(x_0, x_1)" in g.replace(assumptions=(sympy.Eq(X0, X1),)).text
    with pytest.raises(ir.VerifyError, match="unbound symbols"):
        ir.verify(g.replace(assumptions=(sympy.Eq(symbol("q"), 3),)))


def test_shape_context_records_facts_from_hints_and_replays_them():
    ctx = ShapeContext({X0: 8, X1: 8})
    assert ctx.equal(X0, X1, "why") is True
    assert ctx.decide(sympy.Eq(X0, 1)) is False
    assert ctx.assumptions == [canonical(sympy.Eq(X0, X1)), canonical(sympy.Ne(X0, 1))]
    replay = ShapeContext(None, ctx.assumptions)
    assert replay.equal(X1, X0) is True and replay.decide(sympy.Eq(X0, 1)) is False
    with pytest.raises(UndecidableError):
        replay.decide(sympy.Gt(X0, 3))
    # provable facts are never recorded
    assert ctx.decide(sympy.Ge(X0 + 1, 1)) is True and len(ctx.assumptions) == 2


def test_orders_with_min_and_max_are_proved_from_their_arguments():
    """``Min(k, n) <= n`` and the like need no assumption (sympy leaves them open): a
    clamp's result compared with what it clamps to."""
    from cuvil_ir.symbolic import prove

    k, n = X0, X1
    assert prove(sympy.Le(sympy.Min(k, n), n)) is True
    assert prove(sympy.Ge(n, sympy.Min(k, n))) is True
    assert prove(sympy.Le(sympy.Max(n - k, 0), n)) is True
    assert prove(sympy.Le(n, sympy.Max(k, n))) is True
    assert prove(sympy.Lt(sympy.Max(n - k, 0), 0)) is False
    assert prove(sympy.Lt(sympy.Min(k, n), n)) is None  # equal when k >= n: undecided
    assert prove(sympy.Le(sympy.Max(k, n), n)) is None
    ctx = ShapeContext({k: 3, n: 5})
    assert ctx.known(sympy.Le(sympy.Min(k, n), n)) is True and ctx.assumptions == []
    assert ctx.known(sympy.Lt(k, n)) is None and ctx.assumptions == []  # known() never assumes


def test_pinned_symbols_make_derived_facts_provable():
    ctx = ShapeContext({X0: 16})
    ctx.decide(sympy.Eq(X0, 16))
    assert ctx.decide(sympy.Eq(sympy.floor(X0 / 4), 4)) is True
    assert len(ctx.assumptions) == 1


def test_canonical_facts_survive_printing():
    for fact in (sympy.Le(sympy.floor(X0 / 2), X0), sympy.Gt(X0 * X1, 2), sympy.Ne(sympy.Mod(X0, 4), 0)):
        once = canonical(fact)
        assert canonical(once) == once
        assert parse_expr(expr_str(once)) == once
        assert "<" not in expr_str(once) and ">" not in expr_str(once)
    assert canonical(sympy.Eq(16, X0)) == canonical(sympy.Eq(X0, 16))
    assert str(canonical(sympy.Eq(16, X0))) == "Eq(x_0, 16)"
    assert parse_expr("floor(x_0*x_1/4)") == sympy.floor(X0 * X1 / 4)


def test_reserved_symbol_names_are_refused():
    with pytest.raises(ValueError):
        symbol("f32")
    with pytest.raises(ValueError):
        symbol("1x")


def test_exact_size_functions_do_not_round():
    """[Note: exact size arithmetic]: floor(x/3 + 2/3) at x = 7 is 3 (2 in floats)."""
    import sympy

    from cuvil_ir.symbolic import exact_code, exact_function, symbol

    x = symbol("x")
    ceil3 = sympy.floor(x / 3 + sympy.Rational(2, 3))
    f = exact_function([x], ceil3)
    assert [f(n) for n in range(10)] == [-(-n // 3) for n in range(10)]
    assert all(type(f(n)) is int for n in range(10))
    assert math_floor_float(7) == 2  # the float evaluation this replaces
    g = exact_function([x], sympy.Eq(sympy.floor((x + ceil3 - 1) / ceil3), 3))
    assert [g(n) for n in (7, 8, 9, 3)] == [True, True, True, True] and g(2) is False
    h = exact_function([x], sympy.Piecewise((1, sympy.Gt(x, 2)), (x - 1, True)) + sympy.Mod(x, 4))
    assert [h(n) for n in (7, 2)] == [4, 3]
    # an integer size is integer arithmetic: floor(p/q) is p // q (cuvil_ir.size_visitor)
    assert exact_code(ceil3, {x: "n"}) == "((n + 2) // 3)"
    assert "Fraction" in exact_code(x / 3, {x: "n"})  # a rational value, exactly


def math_floor_float(n: int) -> int:
    import math

    return math.floor((1 / 3) * n + 2 / 3)


def test_a_floor_division_size_reaches_torch_as_floordiv() -> None:
    """torch's value ranges cannot take ``s*t/u`` (a negative power): a size ``floor(s*t/u)``
    user code compares (transformers' padding ``kv_length + offset - mask.shape[-1] > 0``)
    failed with "Exponent must be non-negative"; it reaches torch as ``FloorDiv``."""
    from cuvil_ir.graph_ir.fake import SymMirror
    from cuvil_ir.symbolic import ShapeContext, symbol

    s, t, u, v = (symbol(n) for n in ("s", "t", "u", "v"))
    ctx = ShapeContext(hints={s: 6, t: 4, u: 3, v: 9})
    m = SymMirror(ctx)
    size = m.symint(v - sympy.floor(s * t / u))
    assert bool(size > 0)  # 9 - 8
    assert int(m.symint(sympy.ceiling(s * t / (u + 2)))) == 5
    assert int(m.symint(sympy.Mod(v, t))) == 1
