"""Cuvil: a Python-native compiler for PyTorch inference.

import cuvil as cu

@cu.compile
def f(x, y):
    return torch.softmax(x @ y + 1.0, dim=-1).sum(0)
"""

from __future__ import annotations

from typing import Any

from cuvil.api import CompiledFunction, CuvilFallbackWarning, Stats, compile
from cuvil.audit import audit
from cuvil.custom_ops import CustomOp, custom_op
from cuvil.errors import CompileError, SourceLoc
from cuvil.inspection import explain
from cuvil.mlir import run_mlir, to_mlir
from cuvil.onnx.api import compile_onnx, export_onnx
from cuvil.plugins import reload_plugins
from cuvil.quantize import QuantizedLinear, quantize
from cuvil_ir.graph_ir.ops.paged import paged_attention, paged_cache_write

__version__ = "0.1.0"


def warmup() -> float:
    """Do the one-time imports the first capture needs, in the caller's thread, and
    return the seconds they took: the capture's size mirror is torch's ``ShapeEnv``
    (``cuvil_ir.graph_ir.fake``), whose construction imports ``torch._dynamo``
    (about 0.7 s; Cuvil calls nothing from ``torch._dynamo``, ``torch.export`` or
    ``torch.compile``). Call it at startup so that the first compiled call pays only
    for compiling (or, with a warm cache, loading); the second call returns at once.

    [Note: no background imports] ``import cuvil`` used to start this import in a
    thread. Another thread importing an overlapping set of torch modules meanwhile
    (``torch.compile`` right after ``import cuvil`` imports ``torch._inductor``, which
    imports ``torch._dynamo``; libraries such as transformers import ``torch._dynamo``)
    takes the same module locks in another order: a deadlock, which Python breaks by
    failing one of the imports, or a hang. Holding the global import lock around the
    background import leaves a window of the same kind. So the import happens in the
    thread that asks for it (``tests/test_preload.py`` checks the race)."""
    import time

    t0 = time.perf_counter()
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    ShapeEnv()
    return time.perf_counter() - t0


def save(f: Any, path: Any, *example_args: Any, **example_kwargs: Any) -> Any:
    """Write an ahead-of-time artifact of ``f`` compiled for these example arguments
    (see :func:`cuvil.aot.save`; ``weights=False`` leaves a module's parameters out)."""
    from cuvil.aot import save as _save

    return _save(f, path, *example_args, **example_kwargs)


def load(path: Any, *, module: Any = None) -> Any:
    """The function saved at ``path`` by :func:`save`, runnable without its source or a
    C compiler (see :func:`cuvil.aot.load`)."""
    from cuvil.aot import load as _load

    return _load(path, module=module)


def backends() -> list[Any]:
    """Every discovered target: name, available, reason (and where it comes from)."""
    from cuvil_runtime.registry import discover

    return discover()


__all__ = [
    "audit",
    "CompileError",
    "CompiledFunction",
    "CuvilFallbackWarning",
    "CustomOp",
    "QuantizedLinear",
    "SourceLoc",
    "Stats",
    "backends",
    "compile",
    "compile_onnx",
    "custom_op",
    "explain",
    "export_onnx",
    "load",
    "paged_attention",
    "paged_cache_write",
    "quantize",
    "reload_plugins",
    "run_mlir",
    "save",
    "to_mlir",
    "warmup",
]
