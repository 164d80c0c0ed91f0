"""A Graph IR graph as an ONNX model: graph inputs and initializers (module weights),
the size symbols' sources, the outputs, opset imports and model-local functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil.onnx.export.builder import OPSET
from cuvil.onnx.export.exporter import Exporter
from cuvil.onnx.export.functions import DomainFunctions
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import expr_str


def export_graph(
    graph: Graph,
    *,
    initializers: dict[str, Any] | None = None,
    outputs: Sequence[int] | None = None,
    opset: int = OPSET,
    producer: str = "cuvil",
    custom_ops: str = "inline",
) -> Any:
    """``graph`` as an ONNX model. ``initializers`` maps graph input names to tensors stored
    in the model (module weights) instead of being model inputs; ``outputs`` picks and
    orders the graph outputs (default: all, in order). ``custom_ops="domain"`` writes
    each custom op as a node of its namespace's domain with its decomposition as a
    model-local function (:mod:`cuvil.onnx.export.functions`); ``"inline"`` writes the
    decomposition in its place."""
    import numpy as np

    if custom_ops not in ("inline", "domain"):
        raise ValueError(f"custom_ops is 'inline' or 'domain', got {custom_ops!r}")
    writer = DomainFunctions() if custom_ops == "domain" else None
    ex = Exporter(opset, custom_ops=writer)
    onnx = ex.onnx
    initializers = initializers or {}
    inputs = []
    inits = []
    for v in graph.inputs:
        name = v.name
        ex.env[v] = name
        if name in initializers:
            t = initializers[name].detach().cpu()
            if t.dtype == _bf16():
                arr = t.float().numpy()
                tp = onnx.helper.make_tensor(
                    name, onnx.TensorProto.BFLOAT16, arr.shape, arr.flatten().tolist()
                )
            else:
                tp = onnx.numpy_helper.from_array(np.ascontiguousarray(t.numpy()), name)
            inits.append(tp)
        else:
            inputs.append(ex.value_info(name, v.type))
    # size symbols: read (lazily, into the prologue) from the first input that has them
    for v in graph.inputs:
        if isinstance(v.type, TensorType):
            for i, d in enumerate(v.type.shape):
                if isinstance(d, sympy.Symbol) and d not in ex.sources:
                    ex.sources[d] = (v.name, i)
    ex.known = _pinned(graph.assumptions)
    ex.assumptions = tuple(graph.assumptions)
    ex.block(graph.nodes)
    picks = list(range(len(graph.outputs))) if outputs is None else list(outputs)
    out_infos = []
    seen: set[str] = set()
    input_names = {v.name for v in graph.inputs}
    for i in picks:
        v = graph.outputs[i]
        name = ex.env[v]
        if name in seen or name in input_names:
            name = ex.op("Identity", [name])
        seen.add(name)
        out_infos.append(ex.value_info(name, v.type))
    nodes = ex.prologue.nodes + ex.scope.nodes
    g = onnx.helper.make_graph(nodes, _ident(graph.name) or "main", inputs, out_infos, initializer=inits)
    if graph.assumptions:
        g.doc_string = "valid when: " + "; ".join(expr_str(a) for a in graph.assumptions)
    functions = writer.functions if writer is not None else {}
    domains = sorted({d for d, _, _ in functions})
    model = onnx.helper.make_model(
        g,
        opset_imports=[
            onnx.helper.make_opsetid("", opset),
            *(onnx.helper.make_opsetid(d, 1) for d in domains),
        ],
        producer_name=producer,
        ir_version=10 if functions else 9,  # function overloads need IR 10
        functions=[functions[k] for k in sorted(functions)],
    )
    if graph.assumptions:
        onnx.helper.set_model_props(
            model, {"cuvil.assumptions": "; ".join(expr_str(a) for a in graph.assumptions)}
        )
    return model


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _pinned(assumptions: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """Symbols an assumption pins to a value (``Eq(x_1, 16)``): exported as fixed dims."""
    out: dict[sympy.Symbol, int] = {}
    for fact in assumptions:
        if isinstance(fact, sympy.Eq):
            for a, b in ((fact.lhs, fact.rhs), (fact.rhs, fact.lhs)):
                if isinstance(a, sympy.Symbol) and b.is_Integer:
                    out[a] = int(b)
    return out


def _bf16() -> Any:
    import torch

    return torch.bfloat16


__all__ = ["export_graph"]
