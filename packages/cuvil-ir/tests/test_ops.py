"""Every declared op, checked against torch itself: what the op tables have in common.

The case tables are in the ``test_ops_<family>.py`` files beside this one (one torch
call per case, checked by :func:`cuvil_ir.testing.check_case`); here are the calls
that must fall back to ``extern``, the shape rules that must reject what torch
rejects, and the check that every declared op has a case in some table.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cuvil_ir import REGISTRY, DType, NotCaptured, ShapeContext, TensorType
from cuvil_ir.graph_ir.registry import infer_types
from cuvil_ir.testing import In, OpCase, capture, spec

T = torch.Tensor
X, Y, Z = In(0), In(1), In(2)


# -- every op has a case ------------------------------------------------------------------------
def _case_tables() -> dict[str, list[OpCase]]:
    """The ``CASES`` of each ``test_ops_*.py`` file beside this one.

    Test files cannot import each other (pytest imports them by path), so each is
    loaded here by path too; loading one only builds its table and defines its tests.
    """
    tables: dict[str, list[OpCase]] = {}
    for path in sorted(Path(__file__).parent.glob("test_ops_*.py")):
        module_spec = importlib.util.spec_from_file_location(f"_op_cases_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        tables[path.name] = module.CASES
    return tables


def test_every_op_has_cases() -> None:
    tables = _case_tables()
    assert len(tables) >= 4, sorted(tables)
    seen: set[str] = set()
    for cases in tables.values():
        for c in cases:
            seen |= {n.op for n in capture(c).emitter.nodes}
    # control-flow ops are built by the frontend, not captured: see test_control_ir.py
    regions = {n for n in REGISTRY.names() if "control_flow" in REGISTRY.get(n).traits}
    # ops declared elsewhere (cu.custom_op in other tests, plugins) have tests of their own
    builtin = {n for n in REGISTRY.names() if REGISTRY.origin(n).startswith("cuvil_ir.")}
    # so are the ops of sizes computed from tensor data: see cuvil-core's test_data_dependent.py
    data = {n for n in REGISTRY.names() if "data_dependent_size" in REGISTRY.get(n).traits}
    # and ops the frontend emits itself (``clone`` for results eager gives as new tensors)
    frontend = {n for n in REGISTRY.names() if "frontend" in REGISTRY.get(n).traits}
    missing = builtin - seen - {"extern"} - regions - data - frontend
    assert not missing, f"ops without a test case: {sorted(missing)}"


def test_case_ids_are_unique_across_tables() -> None:
    ids = [c.id for cases in _case_tables().values() for c in cases]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


# -- calls that must fall back to extern ------------------------------------------------------
DECLINED = [
    OpCase(
        "getitem-tensor-index", T.__getitem__, (X, Y), (spec(4, 3), spec(2, dtype=torch.int64, low=0, high=4))
    ),
    OpCase(
        "batch_norm-train",
        F.batch_norm,
        (X, Y, Z),
        (spec(2, 3), spec(3, static=True), spec(3, static=True)),
        {"training": True},
    ),
    OpCase(
        "sdpa-dropout", F.scaled_dot_product_attention, (X, X, X), (spec(1, 2, 4, 8),), {"dropout_p": 0.1}
    ),
    OpCase("sum-out", torch.sum, (X,), (spec(2, 3),), {"out": In(0)}),
    OpCase("to-cuda", T.to, (X, "cuda"), (spec(2, 3),)),
    OpCase("view-dtype", T.view, (X, torch.int32), (spec(2, 3),)),
    OpCase("max_pool-indices", F.max_pool2d, (X, 2), (spec(1, 1, 4, 4),), {"return_indices": True}),
    OpCase(
        "embedding-max_norm",
        F.embedding,
        (X, Y),
        (spec(3, dtype=torch.int64, low=0, high=5), spec(5, 2, static=True)),
        {"max_norm": 1.0},
    ),
    OpCase("softmax-no-dim", F.softmax, (X,), (spec(2, 3),)),
    OpCase("clamp-mixed-bounds", torch.clamp, (X,), (spec(2, 3), spec(3)), {"min": In(1), "max": 0.25}),
    OpCase("dropout2d-train", F.dropout2d, (X, 0.5, True), (spec(1, 2, 3, 3),)),
]


@pytest.mark.parametrize("c", DECLINED, ids=lambda c: c.id)
def test_declined(c: OpCase) -> None:
    with pytest.raises(NotCaptured):
        capture(c)


# -- shape rules reject what torch rejects -----------------------------------------------------
def _tt(*shape: Any, dtype: DType = DType.f32) -> TensorType:
    return TensorType(dtype, shape)


REJECTED = [
    ("matmul", (_tt(2, 3), _tt(4, 5)), {}),
    ("matmul", (_tt(2, 3), _tt(3, dtype=DType.f64)), {}),
    ("cat", (_tt(2, 3), _tt(3, 3)), {"dim": 1}),
    ("reshape", (_tt(2, 3),), {"shape": (4, -1)}),
    ("reshape", (_tt(2, 3),), {"shape": (-1, -1)}),
    ("squeeze", (_tt(2, 3),), {"dims": (0,)}),
    ("expand", (_tt(2, 3),), {"shape": (4, 3)}),
    ("split", (_tt(5, 2),), {"dim": 0, "sizes": (2, 2)}),
    ("select", (_tt(3, 2),), {"dim": 0, "index": 3}),
    ("select", (_tt(3, 2),), {"dim": 0, "index": -4}),
    ("permute", (_tt(3, 2),), {"perm": (0, 0)}),
    ("mean", (_tt(3, dtype=DType.i64),), {"dims": (0,), "keepdim": False, "dtype": None}),
    ("var", (_tt(3, dtype=DType.i32),), {"dims": (0,), "correction": 1, "keepdim": False}),
    ("softmax", (_tt(3, dtype=DType.i64),), {"dim": 0, "dtype": None}),
    ("linear", (_tt(2, 3), _tt(4, 5)), {"has_bias": False}),
    (
        "conv",
        (_tt(1, 4, 5, 5), _tt(2, 3, 3, 3)),
        {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1, "has_bias": False},
    ),
    (
        "conv",
        (_tt(1, 3, 2, 2), _tt(2, 3, 3, 3)),
        {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1, "has_bias": False},
    ),
    ("group_norm", (_tt(2, 5, 3),), {"num_groups": 2, "eps": 1e-5, "has_weight": False, "has_bias": False}),
    (
        "layer_norm",
        (_tt(2, 3), _tt(4)),
        {"normalized_shape": (3,), "eps": 1e-5, "has_weight": True, "has_bias": False},
    ),
    ("embedding", (_tt(3, dtype=DType.f32), _tt(5, 2)), {}),
    ("arange", (), {"start": 5, "end": 0, "step": 1, "dtype": DType.i64, "device": "cpu"}),
    ("argmax", (_tt(3, dtype=DType.bool),), {"dim": None, "keepdim": False}),
]


@pytest.mark.parametrize("op,types,attrs", REJECTED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REJECTED)])
def test_rejects(op: str, types: tuple[TensorType, ...], attrs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # ShapeError (a ValueError)
        infer_types(REGISTRY.get(op), ShapeContext({}), list(types), attrs)
