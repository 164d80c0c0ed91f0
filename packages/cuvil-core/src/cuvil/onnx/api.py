"""``cuvil.export_onnx`` and ``cuvil.compile_onnx``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _require_onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise ImportError("ONNX support needs the onnx package: pip install 'cuvil[onnx]'") from e
    return onnx


def export_onnx(
    f: Any, *example_args: Any, path: str | os.PathLike[str] | None = None, custom_ops: str = "inline"
) -> Any:
    """Capture ``f`` on ``example_args`` and return its Graph IR as an ``onnx.ModelProto``.

    ``f`` is a ``cu.compile`` d callable or a plain function / ``nn.Module`` (compiled
    here with target ``"reference"``). The model's inputs are the tensor arguments,
    in order, with ``dim_param`` s named after the size symbols (``x_0``); module
    parameters, buffers and lifted tensors are stored as initializers; the outputs
    are the tensor leaves of the result, in ``tree_flatten`` order. With ``path``
    the model is also written there. A ``cu.custom_op`` is written as its decomposition
    (``custom_ops="inline"``) or as a node of its namespace's domain with the
    decomposition as a model-local function (``"domain"``).
    """
    onnx = _require_onnx()
    from cuvil.api import CompiledFunction, compile
    from cuvil.onnx.export import export_graph

    cf = f if isinstance(f, CompiledFunction) else compile(f, target="reference", fallback="error")
    cf(*example_args)
    art = cf._last
    if art is None or art.captured is None:
        reason = art.reason if art is not None else "nothing was captured"
        raise RuntimeError(f"export_onnx: {cf.__qualname__} could not be captured: {reason}")
    c = art.captured
    graph = c.graph
    inits: dict[str, Any] = {}
    for v, (kind, where) in zip(graph.inputs, c.inputs):
        if kind == "state":
            inits[v.name] = where[0][where[1]]
        elif kind != "leaf":
            inits[v.name] = where()
    picks = [i for kind, i in c.outputs if kind == "graph"]
    model = export_graph(graph, initializers=inits, outputs=picks, custom_ops=custom_ops)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def compile_onnx(
    model_or_path: Any, target: str | None = None, device: str = "cpu", **compile_kwargs: Any
) -> Callable[..., Any]:
    """Read an ONNX model (a ``ModelProto``, a path, or bytes) into Graph IR and compile it.

    Returns a callable taking the model's (non-initializer) inputs positionally as
    torch tensors and returning its outputs: one tensor, or a tuple. Inputs whose
    dims carry a ``dim_param`` get one size symbol per distinct name; the graph is
    built (and compiled) for the first call and rebuilt only when a later call's
    sizes break a size fact the graph relies on. ``device`` is the torch device type
    the inputs live on; ``target=None`` picks the best available target for it.
    """
    _require_onnx()
    from cuvil.onnx.import_ import OnnxFunction

    return OnnxFunction(model_or_path, target=target, device=device, **compile_kwargs)
