"""Decompositions (:mod:`cuvil_ir.graph_ir.decompose`): every composite op's decomposition,
evaluated primitive by primitive with the primitives' own torch references, equals the
composite's reference on every case of the op tables; low-precision inputs compute in f32
inside it; the expansion is well-typed Graph IR."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch
from torch.utils import _pytree as pytree

from cuvil_ir import REGISTRY, DType, Graph, Node, TensorType, Value, verify
from cuvil_ir.graph_ir.decompose import NotDecomposed, expand
from cuvil_ir.symbolic import evaluate, evaluate_bool
from cuvil_ir.testing import OpCase, capture

COMPOSITE = sorted(n for n in REGISTRY.names() if REGISTRY.get(n).decompose is not None)


def _cases() -> list[OpCase]:
    """The cases of every ``test_ops_*.py`` table (loaded by path, as test_ops.py does)."""
    out: list[OpCase] = []
    for path in sorted(Path(__file__).parent.glob("test_ops_*.py")):
        spec = importlib.util.spec_from_file_location(f"_decompose_cases_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out += module.CASES
    return out


def _composite_cases() -> list[OpCase]:
    found = []
    for c in _cases():
        try:
            nodes = capture(c).emitter.nodes
        except Exception:  # cases that must fall back to extern live elsewhere
            continue
        if any(n.op in COMPOSITE for n in nodes):
            found.append(c)
    return found


CASES = _composite_cases()


def _attr(v: Any, hints: dict[sympy.Symbol, int]) -> Any:
    if isinstance(v, sympy.Basic):
        cond = isinstance(v, sympy.logic.boolalg.Boolean) and not isinstance(v, sympy.Expr)
        return evaluate_bool(v, hints) if cond else evaluate(v, hints)
    if isinstance(v, tuple):
        return tuple(_attr(x, hints) for x in v)
    return v


def run(nodes: tuple[Node, ...] | list[Node], env: dict[str, Any], hints: dict[sympy.Symbol, int]) -> None:
    """Evaluate ``nodes`` with each op's torch reference, filling ``env`` (name -> value)."""
    for n in nodes:
        attrs = {k: _attr(v, hints) for k, v in n.attrs}
        res = REGISTRY.get(n.op).reference(*(env[v.name] for v in n.inputs), **attrs)
        for v, r in zip(n.outputs, res if isinstance(res, tuple) else (res,)):
            env[v.name] = r


def test_the_composite_ops_have_cases() -> None:
    covered = {n.op for c in CASES for n in capture(c).emitter.nodes}
    # ops the frontend emits itself are tested where it emits them (test_output_aliasing.py)
    frontend = {n for n in COMPOSITE if "frontend" in REGISTRY.get(n).traits}
    assert not set(COMPOSITE) - covered - frontend, sorted(set(COMPOSITE) - covered - frontend)
    assert {"gelu", "softmax", "layer_norm", "rms_norm", "group_norm"} <= set(COMPOSITE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decomposition_matches_the_reference(case: OpCase) -> None:
    em, values, examples, _ = capture(case)
    env: dict[str, Any] = {v.name: e for v, e in zip(values, examples)}
    assumptions = tuple(em.ctx.assumptions)
    checked = 0
    for n in em.nodes:
        run([n], env, em.hints)
        if n.op not in COMPOSITE:
            continue
        ex = expand(n, assumptions)
        sub = dict(env)
        run(ex.nodes, sub, em.hints)
        for want, got in zip(n.outputs, ex.outputs):
            w, g = env[want.name], sub[got.name]
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, equal_nan=True)  # the dtype's default tolerance
        # the expansion is Graph IR that verifies on its own
        g = Graph("d", tuple(n.inputs), ex.nodes, ex.outputs, assumptions + ex.facts)
        verify(g)
        checked += 1
    assert checked


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_mlir_matches_the_reference(case: OpCase) -> None:
    """The MLIR oracle emits composites from their decompositions and is checked against
    the ops' torch references, so it shares no bug with the decompositions."""
    pytest.importorskip("torch_mlir")
    from cuvil_ir.mlir import run_mlir, to_mlir

    em, values, examples, result = capture(case)
    outs = [h.value for h in pytree.tree_leaves(result)]
    g = Graph("f", tuple(values), tuple(em.nodes), tuple(outs), tuple(em.ctx.assumptions))
    assert to_mlir(g).lowerable, to_mlir(g).reasons
    env: dict[str, Any] = {v.name: e for v, e in zip(values, examples)}
    run(em.nodes, env, em.hints)
    for got, v in zip(run_mlir(g, *examples), outs):
        torch.testing.assert_close(got, env[v.name], equal_nan=True)


_X = Value("x", TensorType(DType.bf16, (3, 5)))


@pytest.mark.parametrize("op", ["gelu", "silu", "mish", "softplus", "logsigmoid", "hardswish", "elu"])
def test_low_precision_computes_in_float32(op: str) -> None:
    attrs = {
        "gelu": {"approximate": "none"},
        "softplus": {"beta": 1.0, "threshold": 20.0},
        "elu": {"alpha": 1.0},
    }.get(op, {})
    n = Node(op, (_X,), (Value("y", _X.type),), tuple(sorted(attrs.items())))
    ex = expand(n)
    casts = [m for m in ex.nodes if m.op == "cast"]
    # one upcast of the input and one rounding of the result, nothing between
    assert [m.attr("dtype") for m in casts] == [DType.f32, DType.bf16], [str(m.op) for m in ex.nodes]
    inner = [v for m in ex.nodes if m not in casts for v in m.outputs if isinstance(v.type, TensorType)]
    assert inner and all(v.type.dtype in (DType.f32, DType.bool) for v in inner)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) * 4
    env: dict[str, Any] = {"x": x}
    run(ex.nodes, env, {})
    want = REGISTRY.get(op).reference(x, **attrs)
    torch.testing.assert_close(env[ex.outputs[0].name], want)


def test_a_fact_the_assumptions_do_not_settle_refuses_to_decompose() -> None:
    a, c, d = (sympy.Symbol(n, integer=True, positive=True) for n in ("a", "c", "d"))
    x = Value("x", TensorType(DType.f32, (a, c)))
    w = Value("w", TensorType(DType.f32, (d,)))
    attrs = (("eps", 1e-5), ("has_bias", False), ("has_weight", True), ("normalized_shape", (c,)))
    n = Node("layer_norm", (x, w), (Value("y", x.type),), attrs)
    with pytest.raises(NotDecomposed):  # is d equal to c? only an assumption could say
        expand(n)
    expand(n, (sympy.Eq(c, d),))  # with it, the weight broadcasts
