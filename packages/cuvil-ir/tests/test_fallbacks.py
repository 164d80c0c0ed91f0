"""Fallback decompositions (:mod:`cuvil_ir.graph_ir.fallbacks`): each is a registered
primitive's (an op without a decomposition of its own) and expands, for every input dtype
the op accepts, into registered ops other than itself, as Graph IR that verifies; the
expansion evaluated with the primitives' torch references matches the op's reference. The
ONNX exporter's use of them is tested in ``cuvil-core/tests/test_onnx_fallbacks.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cuvil_ir import REGISTRY, DType, Graph, Node, TensorType, Value, verify
from cuvil_ir.graph_ir.decompose import Expansion, expand
from cuvil_ir.graph_ir.fallbacks import FALLBACKS, fallback
from cuvil_ir.graph_ir.registry import infer_types
from cuvil_ir.symbolic import ShapeContext

OPS = sorted(FALLBACKS)
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
@pytest.mark.parametrize("op", OPS)
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
@pytest.mark.parametrize("op", OPS)
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
