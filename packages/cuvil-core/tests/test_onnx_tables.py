"""The one-to-one ONNX tables (see [Note: one-to-one ONNX tables] in
``cuvil/onnx/export/elementwise.py``): export's ``UNARY``, ``BINARY`` and ``REDUCE`` map a
Cuvil op to one ONNX op, and import reads them backwards. Every entry round-trips: a
one-node graph is exported, run by onnxruntime and imported back by ``compile_onnx``,
each compared with the op's eager reference, and the import gives back the same op.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from cuvil.onnx import compile_onnx  # noqa: E402
from cuvil.onnx.export import export_graph  # noqa: E402
from cuvil.onnx.export.elementwise import BINARY, UNARY  # noqa: E402
from cuvil.onnx.export.reduction import REDUCE  # noqa: E402
from cuvil.onnx.import_ import OPS as IMPORT_OPS  # noqa: E402
from cuvil_ir import REGISTRY  # noqa: E402
from cuvil_ir.graph_ir.nodes import Graph, Node, Value  # noqa: E402
from cuvil_ir.graph_ir.registry import infer_types  # noqa: E402
from cuvil_ir.graph_ir.types import DType, TensorType  # noqa: E402
from cuvil_ir.symbolic import ShapeContext  # noqa: E402

CASES = [(op, 1) for op in UNARY] + [(op, 2) for op in BINARY] + [(op, 1) for op in REDUCE]

_BOOL_INPUTS = {"logical_not", "logical_and", "logical_or", "logical_xor"}
_INT_INPUTS = {"bitwise_and", "bitwise_or", "bitwise_xor"}
_POSITIVE_FIRST = {"log", "sqrt", "reciprocal", "pow"}  # the domain (pow: a positive base)


def _inputs(op: str, arity: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shape = (3, 4)
    if op in _BOOL_INPUTS:
        return [torch.rand(shape, generator=g) > 0.5 for _ in range(arity)]
    if op in _INT_INPUTS:
        return [torch.randint(-8, 8, shape, generator=g, dtype=torch.int32) for _ in range(arity)]
    xs = [torch.randn(shape, generator=g) * 2 for _ in range(arity)]
    if op in _POSITIVE_FIRST:
        xs[0] = xs[0].abs() + 0.5
    if arity == 2:
        xs[1][0] = xs[0][0]  # some equal pairs, for the comparisons
    return xs


def _attrs(op: str) -> dict[str, Any]:
    if op in REDUCE:
        attrs: dict[str, Any] = {"dims": (1,), "keepdim": False}
        if "dtype" in REGISTRY.get(op).attr_names:
            attrs["dtype"] = None
        return attrs
    return {}


def _one_node_graph(op: str, xs: list[torch.Tensor], attrs: dict[str, Any]) -> Graph:
    ins = tuple(
        Value(f"x{i}", TensorType(DType.from_torch(x.dtype), tuple(x.shape), "cpu")) for i, x in enumerate(xs)
    )
    types = infer_types(REGISTRY.get(op), ShapeContext(), [v.type for v in ins], attrs)
    outs = tuple(Value(f"y{i}", t) for i, t in enumerate(types))
    return Graph(op, ins, (Node(op, ins, outs, tuple(attrs.items())),), outs)


def test_every_one_to_one_onnx_op_has_an_import_handler() -> None:
    written = set(UNARY.values()) | set(BINARY.values()) | set(REDUCE.values())
    assert not written - set(IMPORT_OPS), "ONNX ops the exporter writes one to one but cannot import"


@pytest.mark.parametrize("op,arity", CASES, ids=[op for op, _ in CASES])
def test_one_to_one_entry_round_trips(op: str, arity: int) -> None:
    xs = _inputs(op, arity)
    attrs = _attrs(op)
    want = REGISTRY.get(op).reference(*xs, **attrs)
    model = export_graph(_one_node_graph(op, xs, attrs))
    onnx_ops = [n.op_type for n in model.graph.node]
    table = {**UNARY, **BINARY, **REDUCE}
    assert table[op] in onnx_ops, onnx_ops

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ran,) = sess.run(None, {f"x{i}": x.numpy() for i, x in enumerate(xs)})
    torch.testing.assert_close(torch.from_numpy(ran), want, equal_nan=True)

    f = compile_onnx(model, target="reference")
    torch.testing.assert_close(f(*xs), want, equal_nan=True)
    assert op in [n.op for n in f.graphs[0].nodes], f.graphs[0].text


def test_a_table_that_is_not_one_to_one_is_refused() -> None:
    from cuvil.onnx.import_.loader import inverse

    assert inverse({"add": "Add", "div": "Div"}, unless=("Div",)) == {"Add": "add"}
    with pytest.raises(ValueError, match="Xor is written for both logical_xor and bitwise_xor"):
        inverse({"logical_xor": "Xor", "bitwise_xor": "Xor"})
