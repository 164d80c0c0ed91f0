"""Fallback decompositions (:mod:`cuvil_ir.graph_ir.fallbacks`): each is a registered
primitive's (an op without a decomposition of its own) and expands, for every input dtype
the op accepts, into registered ops other than itself, as Graph IR that verifies; the
expansion evaluated with the primitives' torch references matches the op's reference.
sdpa's (three or four inputs, attributes) has cases of its own, captured from torch calls
with symbolic sizes and compared with eager attention. The ONNX exporter's use of them is
tested in ``cuvil-core/tests/test_onnx_fallbacks.py``, MLIR's in ``test_mlir.py``."""

from __future__ import annotations

from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F

from cuvil_ir import REGISTRY, DType, Graph, Node, TensorType, Value, verify
from cuvil_ir.graph_ir.decompose import Expansion, NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.fallbacks import FALLBACKS, fallback
from cuvil_ir.graph_ir.registry import infer_types
from cuvil_ir.symbolic import ShapeContext
from cuvil_ir.testing import In, OpCase, capture, spec

OPS = sorted(FALLBACKS)
#: the one-input elementwise fallbacks (sdpa's cases are below)
UNARY = sorted(set(FALLBACKS) - {"sdpa"})
DTYPES = [DType.f32, DType.f64, DType.f16, DType.bf16, DType.i32, DType.i64, DType.bool]


def _node(op: str, dtype: DType) -> Node | None:
    x = Value("x", TensorType(dtype, (3, 5)))
    try:
        (t,) = infer_types(REGISTRY.get(op), ShapeContext(), [x.type], {})
    except ValueError:
        return None  # the op refuses this dtype
    return Node(op, (x,), (Value("y", t),), ())


def _expand(n: Node) -> Expansion:
    fn = fallback(n.op)
    assert fn is not None
    return expand(n, (), fn)


def _run(nodes: tuple[Node, ...], env: dict[str, Any]) -> None:
    for n in nodes:
        env[n.outputs[0].name] = REGISTRY.get(n.op).reference(*(env[v.name] for v in n.inputs), **n.attr_dict)


def _example(op: str, dtype: DType) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == DType.bool:
        return torch.rand(3, 5, generator=g) > 0.5
    x = torch.randn(3, 5, generator=g) * 4
    if op in ("rsqrt", "log2", "log1p"):
        x = x.abs() + 0.25  # the domain
    return x.to(dtype.torch)


@pytest.mark.parametrize("op", OPS)
def test_a_fallback_is_a_registered_primitives(op: str) -> None:
    assert op in REGISTRY, f"{op}: a fallback for an unregistered op"
    decl = REGISTRY.get(op)
    assert decl.decompose is None, f"{op} has a decomposition: a fallback would shadow it"
    assert "composite" not in decl.traits


def test_an_op_without_a_fallback_has_none() -> None:
    assert fallback("exp") is None and fallback("no_such_op") is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", UNARY)
def test_a_fallback_expands_into_registered_ops(op: str, dtype: DType) -> None:
    n = _node(op, dtype)
    if n is None:
        pytest.skip(f"{op} refuses {dtype.name}")
    ex = _expand(n)
    used = {m.op for m in ex.nodes}
    assert used <= set(REGISTRY.names()), used - set(REGISTRY.names())
    assert op not in used, f"{op}'s fallback uses {op}"
    assert not {o for o in used if REGISTRY.get(o).decompose is None and o in FALLBACKS}, (
        "a fallback expands into primitives a consumer may lack as well"
    )
    verify(Graph("f", n.inputs, ex.nodes, ex.outputs))  # well-typed, of the op's result type
    assert [v.type for v in ex.outputs] == [v.type for v in n.outputs]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", UNARY)
def test_a_fallback_matches_the_reference(op: str, dtype: DType) -> None:
    n = _node(op, dtype)
    if n is None:
        pytest.skip(f"{op} refuses {dtype.name}")
    x = _example(op, dtype)
    try:
        want = REGISTRY.get(op).reference(x)
    except (NotImplementedError, RuntimeError):
        pytest.skip(f"eager {op} refuses {dtype.name} (so does capture)")
    ex = _expand(n)
    env: dict[str, Any] = {"x": x}
    _run(ex.nodes, env)
    got = env[ex.outputs[0].name]
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)  # the dtype's default tolerance


def test_trunc_of_an_integer_is_the_input() -> None:
    n = _node("trunc", DType.i32)
    assert n is not None
    ex = _expand(n)
    assert ex.nodes == () and ex.outputs == n.inputs


def test_a_fallback_is_not_read_by_the_declared_decomposition_path() -> None:
    """Tensor IR lowering has native forms: ``expand`` without ``decompose=`` refuses a
    primitive, fallback or not."""
    from cuvil_ir.graph_ir.decompose import NotDecomposed

    n = _node("rsqrt", DType.f32)
    assert n is not None
    with pytest.raises(NotDecomposed):
        expand(n)


# -- sdpa ------------------------------------------------------------------------------------
Q, K, V = In(0), In(1), In(2)
sdpa_call = F.scaled_dot_product_attention
f64, f16 = torch.float64, torch.float16

#: torch calls whose capture is one sdpa node, over symbolic sizes (every size a symbol)
SDPA_CASES = [
    OpCase("plain", sdpa_call, (Q, K, V), (spec(2, 3, 4, 8), spec(2, 3, 5, 8), spec(2, 3, 5, 6))),
    # q, k and v batch dims broadcast (and k, v of other ranks), as torch's do
    OpCase("broadcast", sdpa_call, (Q, K, V), (spec(1, 3, 4, 8), spec(2, 1, 5, 8), spec(5, 6))),
    OpCase("causal", sdpa_call, (Q, K, K), (spec(1, 2, 4, 8), spec(1, 2, 6, 8)), {"is_causal": True}),
    OpCase("causal-L>S", sdpa_call, (Q, K, K), (spec(2, 7, 8), spec(2, 3, 8)), {"is_causal": True}),
    OpCase(
        "scale", sdpa_call, (Q, K, K), (spec(2, 4, 8, dtype=f64), spec(2, 5, 8, dtype=f64)), {"scale": 0.3}
    ),
    OpCase(
        "bool-mask",
        sdpa_call,
        (Q, K, K, V),
        (spec(2, 2, 3, 4), spec(2, 2, 5, 4), spec(1, 1, 3, 5, dtype=torch.bool)),
    ),
    OpCase("float-mask", sdpa_call, (Q, Q, Q), (spec(1, 4, 4), spec(4, 4)), {"attn_mask": K}),
    OpCase(
        "gqa",
        sdpa_call,
        (Q, K, V),
        (spec(2, 6, 3, 8), spec(2, 2, 5, 8), spec(2, 3, 5, 4)),
        {"enable_gqa": True},
    ),
    OpCase(
        "f16", sdpa_call, (Q, K, K), (spec(2, 4, 8, dtype=f16), spec(2, 6, 8, dtype=f16)), {"is_causal": True}
    ),
]


def _sdpa_graph(c: OpCase) -> tuple[Graph, Node, list[torch.Tensor], Any, dict[sympy.Symbol, int]]:
    em, values, examples, result = capture(c)
    (node,) = [n for n in em.nodes if n.op == "sdpa"]
    g = Graph("f", tuple(values), tuple(em.nodes), (result.value,), tuple(em.ctx.assumptions))
    verify(g)
    return g, node, examples, result, em.hints


def _evaluate(nodes: tuple[Node, ...], env: dict[str, Any], hints: dict[sympy.Symbol, int]) -> None:
    """Each node's reference, with size expressions in attributes at the example sizes."""

    def at(v: Any) -> Any:
        if isinstance(v, sympy.Basic):
            x = sympy.sympify(v.xreplace(hints))
            return int(x) if x.is_Integer else float(x)
        return tuple(at(x) for x in v) if isinstance(v, tuple) else v

    for n in nodes:
        attrs = {k: at(v) for k, v in n.attr_dict.items()}
        if n.op == "const":
            env[n.outputs[0].name] = attrs["value"]
            continue
        env[n.outputs[0].name] = REGISTRY.get(n.op).reference(*(env[v.name] for v in n.inputs), **attrs)


def _sdpa_expanded(c: OpCase) -> tuple[torch.Tensor, torch.Tensor, Expansion, Graph]:
    g, node, examples, result, hints = _sdpa_graph(c)
    ex = expand(node, g.assumptions, fallback("sdpa"))
    env: dict[str, Any] = {v.name: x for v, x in zip(g.inputs, examples)}
    before = tuple(n for n in g.nodes if n is not node)  # the mask's nodes, if any
    _evaluate(before + ex.nodes, env, hints)
    eager = sdpa_call(
        *[examples[a.i] for a in c.args],
        **{k: examples[v.i] if isinstance(v, In) else v for k, v in c.kwargs.items()},
    )
    expanded = Graph("e", g.inputs, before + ex.nodes, ex.outputs, g.assumptions + ex.facts)
    return env[ex.outputs[0].name], eager, ex, expanded


@pytest.mark.parametrize("c", SDPA_CASES, ids=lambda c: c.id)
def test_sdpa_fallback_matches_eager(c: OpCase) -> None:
    got, want, ex, expanded = _sdpa_expanded(c)
    verify(expanded)  # well-typed under the graph's assumptions, of sdpa's result type
    used = {n.op for n in ex.nodes}
    assert "sdpa" not in used and used <= set(REGISTRY.names())
    assert not used & set(FALLBACKS), "sdpa expands into primitives a consumer may lack as well"
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {"atol": 2e-3, "rtol": 2e-3} if want.dtype == torch.float16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(got, want, **tol)


def test_sdpa_fallback_repeats_kv_heads_for_gqa() -> None:
    """k's and v's heads (2 and 3 of q's 6) repeat through unsqueeze, expand and reshape;
    the reshape's element count is proved from the rule's divisibility assumptions."""
    _, _, ex, _ = _sdpa_expanded(SDPA_CASES[7])
    assert [n.op for n in ex.nodes].count("reshape") == 2
    assert ex.facts, "the proved Hk*floor(Hq/Hk) == Hq facts are stated"


@pytest.mark.parametrize("masked", ["bool", "float"])
def test_sdpa_fallback_gives_zeros_for_rows_masked_entirely(masked: str) -> None:
    """torch's _safe_softmax: a row of -inf scores gives zeros, not a softmax's NaN."""
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    mask = keep if masked == "bool" else torch.zeros(3, 5).masked_fill(~keep, float("-inf"))
    dt = torch.bool if masked == "bool" else torch.float32
    c = OpCase("m", sdpa_call, (Q, K, K, V), (spec(1, 2, 3, 4), spec(1, 2, 5, 4), spec(3, 5, dtype=dt)))
    g, node, examples, _, hints = _sdpa_graph(c)
    examples[2] = mask
    ex = expand(node, g.assumptions, fallback("sdpa"))
    env: dict[str, Any] = {v.name: x for v, x in zip(g.inputs, examples)}
    _evaluate(ex.nodes, env, hints)
    got = env[ex.outputs[0].name]
    want = sdpa_call(examples[0], examples[1], examples[1], attn_mask=mask)
    assert (got[:, :, 1] == 0).all()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("c", [SDPA_CASES[5], SDPA_CASES[6]], ids=["bool", "float"])
def test_sdpa_finds_rows_masked_entirely_on_the_mask(c: OpCase) -> None:
    """The rows to zero are found by one reduction over the mask (3 x 5, or 4 x 4), not
    over the L x S scores of every batch and head: the expansion reads the scores no more
    often than attention must (ONNX: no slower than the hand-written export it replaced)."""
    g, node, _, _, _ = _sdpa_graph(c)
    ex = expand(node, g.assumptions, fallback("sdpa"))
    reductions = [n for n in ex.nodes if n.op in ("any", "amax")]
    assert len(reductions) == 1 and reductions[0].inputs[0] == node.inputs[3]


def test_sdpa_symbolic_embedding_size_scales_by_a_size_expression() -> None:
    _, _, ex, _ = _sdpa_expanded(SDPA_CASES[0])
    consts = [n.attr("value") for n in ex.nodes if n.op == "const"]
    assert any(isinstance(v, sympy.Basic) and v.free_symbols for v in consts), consts  # 1/sqrt(a3)


def test_sdpa_stays_a_primitive_for_tensor_ir() -> None:
    """The cpu target's flash kernel and attention rewrite see sdpa itself: it has no
    declared decomposition, and Tensor IR lowering never reads the fallback table."""
    decl = REGISTRY.get("sdpa")
    assert decl.decompose is None and "tensor_ir" in decl.extern_reasons
    assert not uses_decomposition("sdpa", "tensor_ir", native=False)
    _, node, _, _, _ = _sdpa_graph(SDPA_CASES[0])
    with pytest.raises(NotDecomposed):
        expand(node)
