"""The primitives ONNX has no op for (rsqrt, log1p, expm1, log2, square, trunc) export as
their fallback decompositions (``cuvil_ir.graph_ir.fallbacks``): a one-node graph is
exported, checked and run by onnxruntime, and compared with the op's eager reference, in
f32 and f64 (and f16 and integer inputs where the op takes them).

Near 0, ``log1p`` and ``expm1`` written as ``log(1 + x)`` and ``exp(x) - 1`` keep an
*absolute* error of about the dtype's epsilon instead of a relative one, which is what a
native form would give: the near-zero cases below use ``atol = 2 * eps`` and show the loss
(``log1p(1e-8)`` in f32 exports as 0).

sdpa (no ONNX op of its own before opset 23's Attention) exports as its fallback, torch's
math form: a bool mask, a float mask, ``is_causal``, an explicit scale, symbolic sequence
lengths and ``enable_gqa``, each run by onnxruntime at the captured sizes and at others,
against eager attention.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from cuvil.onnx.export import OPS, ExportError, export_graph  # noqa: E402
from cuvil_ir import REGISTRY  # noqa: E402
from cuvil_ir.graph_ir import fallbacks  # noqa: E402
from cuvil_ir.graph_ir.nodes import Graph, Node, Value  # noqa: E402
from cuvil_ir.graph_ir.registry import infer_types  # noqa: E402
from cuvil_ir.graph_ir.types import DType, TensorType  # noqa: E402
from cuvil_ir.symbolic import ShapeContext  # noqa: E402

FALLBACK_OPS = sorted(fallbacks.FALLBACKS)
#: the one-input elementwise fallbacks (sdpa's cases are at the end)
UNARY = sorted(set(fallbacks.FALLBACKS) - {"sdpa"})
_DOMAIN_POSITIVE = {"rsqrt", "log2", "log1p"}


def _graph(op: str, x: torch.Tensor) -> Graph:
    v = Value("x", TensorType(DType.from_torch(x.dtype), tuple(x.shape), "cpu"))
    (t,) = infer_types(REGISTRY.get(op), ShapeContext(), [v.type], {})
    y = Value("y", t)
    return Graph(op, (v,), (Node(op, (v,), (y,), ()),), (y,))


def _run_onnx(op: str, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    model = export_graph(_graph(op, x))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    return torch.from_numpy(y), [n.op_type for n in model.graph.node]


def _example(op: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64) * 3
    if op in _DOMAIN_POSITIVE:
        x = x.abs() + 0.25
    if op == "trunc":
        x[0, :4] = torch.tensor([-2.5, -0.5, 0.5, 2.0])  # both signs, and an exact integer
    return x.to(dtype)


def test_these_primitives_have_no_onnx_entry() -> None:
    """They reach ONNX only through their fallbacks (an entry would make this test moot)."""
    assert not set(FALLBACK_OPS) & set(OPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", UNARY)
def test_a_fallback_exported_matches_eager(op: str, dtype: torch.dtype) -> None:
    x = _example(op, dtype)
    got, onnx_ops = _run_onnx(op, x)
    want = REGISTRY.get(op).reference(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert onnx_ops, "an exported node"


@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.int64], ids=["f16", "i32", "i64"])
@pytest.mark.parametrize("op", UNARY)
def test_a_fallback_exported_matches_eager_in_other_dtypes(op: str, dtype: torch.dtype) -> None:
    """f16 computes in f32 inside the expansion and rounds once, as eager does; integer
    inputs are converted as the op's rule says (f32 for the float-valued ops)."""
    x = _example(op, dtype)
    got, _ = _run_onnx(op, x)
    want = REGISTRY.get(op).reference(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_square_of_bool_is_int64() -> None:
    x = torch.tensor([[True, False, True]])
    got, _ = _run_onnx("square", x)
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, torch.square(x))


def test_trunc_of_an_integer_exports_no_arithmetic() -> None:
    x = torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3)
    got, onnx_ops = _run_onnx("trunc", x)
    torch.testing.assert_close(got, x)
    assert not {"Ceil", "Floor", "Where"} & set(onnx_ops)


_NEAR_ZERO = [1e-3, -1e-3, 1e-5, -1e-5, 1e-7, 3e-9, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", ["log1p", "expm1"])
def test_near_zero_the_error_is_absolute(op: str, dtype: torch.dtype) -> None:
    x = torch.tensor([_NEAR_ZERO], dtype=dtype)
    got, _ = _run_onnx(op, x)
    want = REGISTRY.get(op).reference(x)
    eps = torch.finfo(dtype).eps
    # the documented loss: within 2 eps absolutely, not within the dtype's relative tolerance
    torch.testing.assert_close(got, want, atol=2 * eps, rtol=0.0)


@pytest.mark.parametrize("op", ["log1p", "expm1"])
def test_near_zero_the_loss_is_real(op: str) -> None:
    """Below f32's epsilon, ``1 + x`` and ``exp(x)`` round to 1: the fallback gives 0 where
    the native op gives x. A native ONNX form would not; this records that it is not one."""
    x = torch.tensor([1e-8], dtype=torch.float32)
    got, _ = _run_onnx(op, x)
    assert got.item() == 0.0
    assert REGISTRY.get(op).reference(x).item() == pytest.approx(1e-8, rel=1e-6)


def test_a_model_using_every_fallback_exports() -> None:
    from cuvil.onnx import export_onnx

    def f(x: torch.Tensor) -> Any:
        p = x.abs() + 0.5
        return (
            torch.rsqrt(p)
            + torch.log1p(p)
            + torch.expm1(x)
            + torch.log2(p)
            + torch.square(x)
            + torch.trunc(3 * x)
        )

    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    model = export_onnx(f, x)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(y), f(x))


def test_without_its_fallback_a_primitive_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(fallbacks.FALLBACKS, "rsqrt")
    with pytest.raises(ExportError, match="'rsqrt'.*no ONNX translation"):
        export_graph(_graph("rsqrt", torch.ones(2, 3)))


def test_a_primitive_refused_for_onnx_gets_no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """``extern_reasons["onnx"]`` outranks the fallback table."""
    decl = REGISTRY.get("rsqrt")
    monkeypatch.setattr(decl, "extern_reasons", {**decl.extern_reasons, "onnx": "a test's reason"})
    with pytest.raises(ExportError, match="a test's reason"):
        export_graph(_graph("rsqrt", torch.ones(2, 3)))


# -- sdpa ----------------------------------------------------------------------------------------
_SDPA = torch.nn.functional.scaled_dot_product_attention

_SDPA_CASES = {
    # name: (capture shapes, q/k/v inputs (k = v for 2), mask dtype, kwargs, shapes run as well)
    "bool-mask": (
        [(2, 2, 3, 4), (2, 2, 5, 4), (1, 1, 3, 5)],
        2,
        torch.bool,
        {},
        [(2, 2, 6, 4), (2, 2, 2, 4), (1, 1, 6, 2)],
    ),
    "float-mask": ([(1, 4, 4), (1, 6, 4), (4, 6)], 2, torch.float32, {}, [(1, 3, 4), (1, 7, 4), (3, 7)]),
    "causal": ([(1, 2, 4, 8), (1, 2, 6, 8)], 2, None, {"is_causal": True}, [(1, 2, 9, 8), (1, 2, 5, 8)]),
    "scale": (
        [(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)],
        3,
        None,
        {"scale": 0.3},
        [(2, 3, 7, 8), (2, 3, 2, 8), (2, 3, 2, 6)],
    ),
    "gqa": (
        [(2, 6, 3, 8), (2, 2, 5, 8), (2, 3, 5, 4)],
        3,
        None,
        {"enable_gqa": True},
        [(2, 6, 4, 8), (2, 2, 7, 8), (2, 3, 7, 4)],
    ),
}


def _sdpa_graph(shapes: list[tuple[int, ...]], args: int, mask_dtype: Any, kw: dict[str, Any]) -> Graph:
    """sdpa captured (every size a symbol) from a torch call on ``shapes``."""
    from cuvil_ir.testing import In, OpCase, capture, spec

    specs = [spec(*s) for s in shapes]
    if mask_dtype is not None:
        specs[-1] = spec(*shapes[-1], dtype=mask_dtype)
        kw = {**kw, "attn_mask": In(len(shapes) - 1)}
    order = (In(0), In(1), In(1)) if args == 2 else (In(0), In(1), In(2))
    em, values, _, result = capture(OpCase("sdpa", _SDPA, order, tuple(specs), kw))
    assert [n.op for n in em.nodes if n.op != "const"] == ["sdpa"]
    return Graph("sdpa", tuple(values), tuple(em.nodes), (result.value,), tuple(em.ctx.assumptions))


def _sdpa_inputs(shapes: list[tuple[int, ...]], mask_dtype: Any, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*s, generator=g) for s in shapes]
    if mask_dtype == torch.bool:
        xs[-1] = torch.rand(*shapes[-1], generator=g) > 0.3
    return xs


def _run(model: Any, xs: list[torch.Tensor]) -> torch.Tensor:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), xs)})
    return torch.from_numpy(y)


@pytest.mark.parametrize("name", sorted(_SDPA_CASES))
def test_sdpa_exports_as_its_fallback_and_matches_eager(name: str) -> None:
    shapes, args, mask_dtype, kw, other = _SDPA_CASES[name]
    model = export_graph(_sdpa_graph(shapes, args, mask_dtype, kw))
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMul", "Softmax"} <= ops and "Attention" not in ops
    for seed, sizes in enumerate([shapes, other]):  # the sequence lengths are dynamic axes
        xs = _sdpa_inputs(sizes, mask_dtype, seed)
        v = xs[2] if args == 3 else xs[1]
        mask = xs[-1] if mask_dtype is not None else None
        want = _SDPA(xs[0], xs[1], v, attn_mask=mask, **kw)
        torch.testing.assert_close(_run(model, xs), want, atol=1e-5, rtol=1e-4)


def test_sdpa_gqa_with_constant_head_counts_matches_eager() -> None:
    """Grouped-query heads as a model has them (6 query heads, 2 key and 3 value heads),
    over symbolic batch and sequence lengths: k's and v's heads repeat to q's."""
    from cuvil_ir import parse_graph

    t = "Tensor[f32, ({}), cpu]"
    g = parse_graph(
        f"graph @gqa(%q: {t.format('a0, 6, a2, 8')}, %k: {t.format('a0, 2, b2, 8')}, %v: {t.format('a0, 3, b2, 4')}) {{\n"
        f"  %0 = sdpa(%q, %k, %v) {{enable_gqa = true, has_mask = false, is_causal = false, scale = none}} : "
        f"{t.format('a0, 6, a2, 4')}\n"
        "  return %0\n}"
    )
    model = export_graph(g)
    onnx.checker.check_model(model, full_check=True)
    for seed, (b, L, S) in enumerate([(2, 3, 5), (1, 7, 2)]):
        xs = _sdpa_inputs([(b, 6, L, 8), (b, 2, S, 8), (b, 3, S, 4)], None, seed)
        want = _SDPA(*xs, enable_gqa=True)
        torch.testing.assert_close(_run(model, xs), want, atol=1e-5, rtol=1e-4)


def test_sdpa_row_masked_entirely_exports_zeros() -> None:
    """As eager (torch's _safe_softmax), not ONNX Softmax's NaN over -inf."""
    model = export_graph(_sdpa_graph([(1, 2, 3, 4), (1, 2, 5, 4), (3, 5)], 2, torch.bool, {}))
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    got = _run(model, [q, k, keep])
    assert (got[:, :, 1] == 0).all()
    torch.testing.assert_close(got, _SDPA(q, k, k, attn_mask=keep))


def test_sdpa_without_its_fallback_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(fallbacks.FALLBACKS, "sdpa")
    with pytest.raises(ExportError, match="'sdpa'.*no ONNX translation"):
        export_graph(_sdpa_graph([(2, 3, 4, 8), (2, 3, 5, 8)], 2, None, {}))
