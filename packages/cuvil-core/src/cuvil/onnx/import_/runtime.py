"""The callable ``cu.compile_onnx`` returns: :class:`OnnxFunction` reads the model's input
signature (a size symbol per distinct ``dim_param``), imports the graph for a call's sizes,
compiles it with a Cuvil target, and reuses it for later calls whose sizes satisfy the
graph's assumptions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from cuvil.onnx.import_.loader import Importer, OnnxImportError, identifier, size_symbol, to_dtype
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.symbolic import evaluate_bool


def _load(model_or_path: Any) -> Any:
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model_or_path))
    if isinstance(model_or_path, (str, os.PathLike)):
        return onnx.load(os.fspath(model_or_path))
    raise TypeError(
        f"compile_onnx expects an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}"
    )


class OnnxFunction:
    """An ONNX model compiled by Cuvil (see :func:`cuvil.compile_onnx`)."""

    def __init__(
        self, model_or_path: Any, target: str | None = None, device: str = "cpu", **compile_kwargs: Any
    ) -> None:
        from cuvil_runtime.registry import default_target, get_target
        from cuvil_runtime.target import CompileOptions

        self.model = _load(model_or_path)
        g = self.model.graph
        inits = {i.name for i in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.output_names = [o.name for o in g.output]
        self.device = device
        self.target = target if target is not None else default_target(device)
        self._target = get_target(self.target)
        if device not in self._target.capabilities.devices:
            raise ValueError(
                f"target {self.target!r} does not run on {device!r} tensors (it runs on "
                f"{', '.join(sorted(self._target.capabilities.devices))}); pass device= or another target"
            )
        self.options = CompileOptions(**compile_kwargs)
        #: per input: (dtype, dims) with dims ints or size symbols
        self.signature: list[tuple[DType, tuple[Any, ...]]] = []
        names: dict[str, sympy.Symbol] = {}
        for vi in (i for i in g.input if i.name not in inits):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise OnnxImportError(f"model input {vi.name!r} is not a tensor")
            dims: list[Any] = []
            for j, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:
                    key = d.dim_param or f"{vi.name}_{j}"
                    if key not in names:
                        names[key] = size_symbol(identifier(key, "d"))
                    dims.append(names[key])
            self.signature.append((to_dtype(tt.elem_type), tuple(dims)))
        self._artifacts: list[tuple[Graph, Any, list[torch.Tensor]]] = []
        self.stats_compiles = 0

    @property
    def graphs(self) -> list[Graph]:
        return [a[0] for a in self._artifacts]

    def _bind(self, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
        if len(args) != len(self.signature):
            raise TypeError(
                f"the ONNX model takes {len(self.signature)} inputs {self.input_names}, got {len(args)}"
            )
        bindings: dict[sympy.Symbol, int] = {}
        for name, a, (dt, dims) in zip(self.input_names, args, self.signature):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"input {name!r} must be a torch.Tensor, got {type(a).__name__}")
            if a.dim() != len(dims):
                raise ValueError(f"input {name!r} must have rank {len(dims)}, got shape {tuple(a.shape)}")
            if a.dtype != dt.torch:
                raise TypeError(f"input {name!r} must be {dt.torch}, got {a.dtype}")
            for j, (d, n) in enumerate(zip(dims, a.shape)):
                if isinstance(d, int):
                    if d != n:
                        raise ValueError(f"input {name!r} dim {j} must be {d}, got {n}")
                elif bindings.setdefault(d, int(n)) != n:
                    raise ValueError(f"input {name!r} dim {j} ({d}) must be {bindings[d]}, got {n}")
        return bindings

    def build(self, bindings: dict[sympy.Symbol, int]) -> tuple[Graph, list[torch.Tensor]]:
        from cuvil_ir.graph_ir.verifier import verify

        types = [TensorType(dt, dims, self.device) for dt, dims in self.signature]
        im = Importer(self.model, bindings, types, self.device)
        graph = im.run()
        verify(graph)
        return graph, im.consts

    def __call__(self, *args: Any) -> Any:
        bindings = self._bind(args)
        for art in self._artifacts:
            if all(evaluate_bool(a, bindings) for a in art[0].assumptions):
                graph, exe, consts = art
                break
        else:
            graph, consts = self.build(bindings)
            from cuvil_runtime.dump import compile_graph

            exe = compile_graph(self._target, graph, self.options)
            self._artifacts.append((graph, exe, consts))
            self.stats_compiles += 1
        outs = exe(*args, *consts)
        outs = tuple(outs)
        return outs[0] if len(outs) == 1 else outs

    def __repr__(self) -> str:
        return f"<cuvil compiled ONNX model {self.model.graph.name!r} target={self.target}>"


__all__ = ["OnnxFunction"]
