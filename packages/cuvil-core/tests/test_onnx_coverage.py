"""Every registered op reaches ONNX export: the exporter maps it natively (``OPS``), or the
op declares a decomposition the exporter writes instead, or, for a primitive, the exporter
writes its fallback decomposition (``cuvil_ir.graph_ir.fallbacks``, or its scalar function's:
``cuvil_ir.graph_ir.scalar_decompositions``), or its declaration
says why it is refused (``extern_reasons["onnx"]``). The Tensor IR and MLIR halves of this check are
in ``packages/cuvil-ir/tests/test_op_coverage.py``.

Also here, end to end: an elementwise op declared once with its decomposition (tanhshrink) is
captured, compiled to one fused CPU kernel, and exported to ONNX, with no other edit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.decompose import Builder, Sym
from cuvil_ir.graph_ir.registry import Op


def missing_onnx() -> list[str]:
    from cuvil.onnx.export import OPS
    from cuvil.onnx.export.exporter import onnx_fallback

    out = []
    for name in REGISTRY.names():
        op = REGISTRY.get(name)
        covered = name in OPS or op.decompose is not None or onnx_fallback(name) is not None
        if not (covered or "onnx" in op.extern_reasons):
            out.append(name)
    return out


def test_every_op_exports_to_onnx_or_says_why_not() -> None:
    assert not missing_onnx(), "ops without an ONNX mapping, a decomposition or extern_reasons['onnx']"


def test_a_missing_entry_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(REGISTRY.get("silu"), "decompose", None)  # silu has no ONNX mapping
    monkeypatch.setattr(REGISTRY.get("cumprod"), "extern_reasons", {})
    assert missing_onnx() == ["cumprod", "silu"]


def test_a_primitive_without_its_fallback_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil_ir.graph_ir import fallbacks

    assert "rsqrt" not in missing_onnx()  # no ONNX op: covered by its fallback
    monkeypatch.delitem(fallbacks.FALLBACKS, "rsqrt")
    assert missing_onnx() == ["rsqrt"]


def test_a_refusal_names_the_declared_reason() -> None:
    pytest.importorskip("onnx")
    from cuvil.onnx.export import ExportError, export_graph
    from cuvil_ir import parse_graph

    g = parse_graph(
        "graph @f(%x: Tensor[f32, (x_0, 4), cpu]) {\n"
        "  %0 = cumprod(%x) {dim = 1, dtype = none} : Tensor[f32, (x_0, 4), cpu]\n"
        "  return %0\n}"
    )
    with pytest.raises(ExportError, match="cumprod.*no cumulative product"):
        export_graph(g)


@pytest.fixture
def tanhshrink() -> Iterator[type[Op]]:
    from cuvil_ir.graph_ir.ops.elementwise import unary

    def decompose(b: Builder, x: Sym) -> Sym:
        return x - x.tanh()

    assert "tanhshrink" not in REGISTRY
    op = unary("tanhshrink", lambda: (F.tanhshrink,), F.tanhshrink, floating=True, decompose=decompose)
    try:
        yield op
    finally:
        REGISTRY._ops.pop("tanhshrink")  # test-only: the registry has no unregistering
        REGISTRY._origin.pop("tanhshrink")
        REGISTRY._by_torch = None


def test_a_new_elementwise_op_runs_on_cpu_and_exports(tanhshrink: type[Op]) -> None:
    import cuvil as cu

    def f(x):  # type: ignore[no-untyped-def]
        return F.tanhshrink(x) * 2.0 + 1.0

    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    c = cu.compile(f, target="cpu", fallback="error")
    torch.testing.assert_close(c(x), f(x))
    assert "tanhshrink(" in c.graphs[0].text
    report = c.artifacts[-1].executable.report
    assert (report.kernels, report.externs) == (1, 0)  # tanhshrink fused with the mul and add

    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from cuvil.onnx import export_onnx

    model = export_onnx(f, x)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(y), f(x))


def test_a_primitive_without_an_onnx_op_is_written_as_its_scalar_decomposition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asinh without its ONNX entry is reported; with a decomposition of its scalar
    function (cuvil_ir.scalar_functions) it exports as that (no Asinh node) and runs."""
    import dataclasses
    import functools

    from cuvil.onnx.export import OPS
    from cuvil_ir import scalar_functions

    monkeypatch.delitem(OPS, "asinh")
    assert "asinh" in missing_onnx()
    row = dataclasses.replace(scalar_functions.TABLE["asinh"], decomposition="log(x + sqrt(x * x + 1))")
    monkeypatch.setitem(scalar_functions.TABLE, "asinh", row)
    monkeypatch.setattr(scalar_functions, "_parsed", functools.cache(scalar_functions._parsed.__wrapped__))
    assert "asinh" not in missing_onnx()

    ort = pytest.importorskip("onnxruntime")
    from cuvil.onnx import export_onnx

    x = torch.rand(3, 5) * 4
    model = export_onnx(lambda t: torch.asinh(t), x)
    kinds = {n.op_type for n in model.graph.node}
    assert "Asinh" not in kinds and {"Log", "Sqrt"} <= kinds, kinds
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(y), torch.asinh(x))
