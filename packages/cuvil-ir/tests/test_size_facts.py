"""What the graph's assumptions pin down (``tensor_ir.values.known_sizes``) and the
specialized graph's facts (``tensor_ir.size_facts.specialize``): found with
transformers' Mistral and T5 decoders, whose specialized graphs failed to verify."""

from __future__ import annotations

import itertools

import pytest
import sympy

from cuvil_ir.graph_ir.nodes import Graph, Node, Value
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.graph_ir.verifier import verify
from cuvil_ir.symbolic import canonical, symbol
from cuvil_ir.tensor_ir.size_facts import specialize
from cuvil_ir.tensor_ir.values import known_sizes

a, b, c, k, q, w = (symbol(n) for n in ("a", "b", "c", "k", "q", "w"))


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_a_symbol_equal_to_two_others_keeps_both_facts_in_any_order(order: tuple[int, ...]) -> None:
    """``Eq(c, a)``, ``Eq(c, b)``, ``Eq(b, 2)``: all three are 2 (a dict from each symbol
    to one other lost a fact, depending on the order)."""
    facts = [sympy.Eq(c, a), sympy.Eq(c, b), sympy.Eq(b, 2)]
    known = known_sizes([facts[i] for i in order])
    assert {s: known.get(s) for s in (a, b, c)} == {a: 2, b: 2, c: 2}


def test_equal_symbols_are_named_by_their_first_name() -> None:
    assert known_sizes([sympy.Eq(c, b), sympy.Eq(b, a)]) == {b: a, c: a}


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        ([sympy.Eq(2 * k, 4)], {k: 2}),
        ([sympy.Eq(q, 1), sympy.Eq(4 * w * q, 32)], {q: 1, w: 8}),  # after q is known
        ([sympy.Eq(3 * k + 1, 7)], {k: 2}),
        ([sympy.Eq(2 * k, 5)], {}),  # not a whole number: nothing learnt
        ([sympy.Eq(2 * k + 8, 4)], {}),  # negative: not a size
        ([sympy.Eq(k * w, 6)], {}),  # two unknowns
    ],
)
def test_a_linear_fact_of_one_unknown_gives_its_value(
    facts: list[sympy.Basic], want: dict[sympy.Basic, int]
) -> None:
    known = known_sizes(facts)
    assert {s: v for s, v in known.items() if isinstance(s, sympy.Symbol)} == want


def test_specialized_facts_are_canonical_so_the_verifier_finds_them() -> None:
    """``Eq(k + q, w)`` with ``q`` pinned to 1 is ``Eq(k + 1, w)`` after specializing;
    an op asking about ``w`` and ``k + 1`` must find it (facts are looked up as written,
    in canonical form: renaming can reorder a fact's sides)."""
    x = Value("x", TensorType(DType.f32, (w,), "cpu"))
    y = Value("y", TensorType(DType.f32, (k,), "cpu"))
    z = Value("z", TensorType(DType.f32, (q,), "cpu"))
    yz = Value("yz", TensorType(DType.f32, (k + q,), "cpu"))
    out = Value("out", TensorType(DType.f32, (w,), "cpu"))
    g = Graph(
        "g",
        (x, y, z),
        (Node("cat", (y, z), (yz,), (("dim", 0),)), Node("add", (x, yz), (out,))),
        (out,),
        (sympy.Eq(q, 1), canonical(sympy.Eq(k + q, w))),
    )
    verify(g)
    special = specialize(g)
    assert all(f == canonical(f) for f in special.assumptions)
    verify(special)


def test_a_context_uses_the_parts_of_conjunctions_and_pinned_expressions() -> None:
    """A guard on a whole shape is one ``And`` fact, and a reshape's ``-1`` leaves a
    ``floor`` pinned by ``Eq(64*floor(...), 512)``: each part is known on its own."""
    from cuvil_ir.symbolic import ShapeContext, equal_classes

    a, b, c, x, y = (symbol(n) for n in ("a_0", "b_0", "c_1", "x_0", "y_0"))
    heads = sympy.floor(8 * x / y)
    facts = [sympy.And(sympy.Eq(a, b), sympy.Eq(c, 2)), sympy.Eq(64 * heads, 512)]
    ctx = ShapeContext(assumptions=facts)
    assert ctx.prove(sympy.Eq(4 * c, 8)) is True
    assert ctx.prove(sympy.Eq(heads, 8)) is True
    assert ctx.known(sympy.Eq(a, b)) is True
    assert equal_classes(facts) == {a: a, b: a}
    assert ShapeContext(assumptions=facts[1:]).prove(sympy.Eq(4 * c, 8)) is None
