"""The ONNX exporter's own pieces: the contract a custom-op writer uses
(``Exporter.separate_graph``) and size expressions (``SizeExprs``), evaluated in
onnxruntime against Python's ``//`` and ``%`` for negative operands too."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from cuvil.onnx.export import Exporter  # noqa: E402
from cuvil_ir.graph_ir.nodes import Value  # noqa: E402
from cuvil_ir.graph_ir.types import DType, TensorType  # noqa: E402


def test_separate_graph_is_a_graph_of_its_own_and_is_restored() -> None:
    ex = Exporter()
    v = Value("x", TensorType(DType.f32, (2,), "cpu"))
    ex.env[v] = "x"
    outer_scope, outer_env = ex.scope, ex.env
    one = ex.const(1.0, DType.f32)
    with pytest.raises(RuntimeError):
        with ex.separate_graph() as nodes:
            assert ex.scope is not outer_scope and ex.scope.parent is None
            assert ex.env == outer_env and ex.env is not outer_env
            again = ex.const(1.0, DType.f32)  # not the outer graph's constant: not visible there
            assert again != one and [nd.output[0] for nd in nodes] == [again]
            ex.env[Value("y", v.type)] = again
            raise RuntimeError
    assert ex.scope is outer_scope and ex.env is outer_env and len(ex.env) == 1
    assert [nd.output[0] for nd in ex.scope.nodes] == [one]
