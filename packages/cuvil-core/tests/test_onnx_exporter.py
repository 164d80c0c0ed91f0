"""The ONNX exporter's own pieces: the contract a custom-op writer uses
(``Exporter.separate_graph``) and size expressions (``SizeExprs``), evaluated in
onnxruntime against Python's ``//`` and ``%`` for negative operands too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch

pytest.importorskip("onnx")

from cuvil.onnx.export import Exporter  # noqa: E402
from cuvil_ir.graph_ir.nodes import Value  # noqa: E402
from cuvil_ir.graph_ir.types import DType, TensorType  # noqa: E402
from cuvil_ir.symbolic import symbol  # noqa: E402


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


# -- size expressions: floor semantics ------------------------------------------------------
def _size_cases() -> list[tuple[Any, Callable[[int, int], int]]]:
    x, y = symbol("x_0"), symbol("x_1")
    return [
        (sympy.floor((x - 7) / 2), lambda a, b: (a - 7) // 2),
        (sympy.floor((x - 7) / -2), lambda a, b: (a - 7) // -2),
        (sympy.floor((2 * x - 9) / 4), lambda a, b: (2 * a - 9) // 4),
        (sympy.floor((x - y) / 3), lambda a, b: (a - b) // 3),
        (sympy.floor(x / (y + 1)), lambda a, b: a // (b + 1)),
        (sympy.floor((x - 5) / (y + 1)), lambda a, b: (a - 5) // (b + 1)),
        (sympy.ceiling((x - 7) / 2), lambda a, b: -((7 - a) // 2)),
        (sympy.ceiling((x - y) / 3), lambda a, b: -((b - a) // 3)),
        (sympy.ceiling(x / 3), lambda a, b: -(-a // 3)),
        (sympy.Mod(x - y, 3), lambda a, b: (a - b) % 3),
        (sympy.Mod(x, -3), lambda a, b: a % -3),
        (sympy.Mod(x - y, -4), lambda a, b: (a - b) % -4),
        (sympy.floor((x - 7) / 2) * 3 + sympy.Mod(x - 7, 5), lambda a, b: (a - 7) // 2 * 3 + (a - 7) % 5),
    ]


def _sizes_model(cases: list[tuple[Any, Callable[[int, int], int]]]) -> Any:
    """A model with inputs ``a: (x_0,)`` and ``b: (x_1,)`` whose outputs are the size
    expressions of ``cases``, exported by ``SizeExprs.expr``, and all of them as one
    shape (``SizeExprs.dims``: a ``Concat``, as reshape targets are written)."""
    onnx = pytest.importorskip("onnx")
    ex = Exporter()
    x, y = symbol("x_0"), symbol("x_1")
    ex.sources = {x: ("a", 0), y: ("b", 0)}
    outs = [ex.op("Identity", [ex.expr(e)]) for e, _ in cases]
    shape = ex.op("Identity", [ex.dims([e for e, _ in cases])])
    h = onnx.helper
    graph = h.make_graph(
        ex.prologue.nodes + ex.scope.nodes,
        "sizes",
        [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [s]) for n, s in (("a", "x_0"), ("b", "x_1"))],
        [h.make_tensor_value_info(o, onnx.TensorProto.INT64, [1]) for o in outs]
        + [h.make_tensor_value_info(shape, onnx.TensorProto.INT64, [len(cases)])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", ex.opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_size_expressions_floor_like_python_for_negative_operands() -> None:
    """ONNX's integer ``Div`` truncates toward zero; Cuvil's sizes (sympy ``floor``,
    ``ceiling``, ``Mod``) mean Python's ``//`` and ``%``: -7 // 2 is -4, not -3."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    cases = _size_cases()
    sess = ort.InferenceSession(_sizes_model(cases).SerializeToString(), providers=["CPUExecutionProvider"])
    wrong = []
    for a in range(0, 13):
        for b in range(0, 9):
            got = sess.run(None, {"a": np.zeros(a, np.float32), "b": np.zeros(b, np.float32)})
            for (e, py), g, d in zip(cases, got, got[-1]):
                if int(g[0]) != py(a, b) or int(d) != py(a, b):
                    wrong.append(f"{e} at x_0={a}, x_1={b}: {int(g[0])}, Python says {py(a, b)}")
    assert not wrong, "\n".join(wrong[:20])


def test_exported_size_expressions_import_back_to_the_same_values() -> None:
    """The importer folds the exported size arithmetic back into the same expressions."""
    pytest.importorskip("onnxruntime")
    from cuvil.onnx import compile_onnx

    cases = _size_cases()
    f = compile_onnx(_sizes_model(cases), target="reference")
    for a, b in ((0, 0), (3, 5), (12, 2)):
        *got, shape = f(torch.zeros(a), torch.zeros(b))
        want = [py(a, b) for _, py in cases]
        assert [int(g.reshape(-1)[0]) for g in got] == want and shape.tolist() == want, (a, b)
