"""Cuvil: a Python-native compiler for PyTorch inference.

import cuvil as cu

@cu.compile
def f(x, y):
    return torch.softmax(x @ y + 1.0, dim=-1).sum(0)
"""

from __future__ import annotations

from typing import Any

from cuvil.api import CompiledFunction, CuvilFallbackWarning, Stats, compile, explain
from cuvil.audit import audit
from cuvil.custom_ops import CustomOp, custom_op
from cuvil.errors import CompileError, SourceLoc
from cuvil.mlir import run_mlir, to_mlir
from cuvil.onnx.api import compile_onnx, export_onnx
from cuvil.plugins import reload_plugins

__version__ = "0.1.0"


def _preload() -> None:
    """Import what the first capture needs while the caller builds its model, so the
    first compiled call does not pay for it. The capture's size mirror is torch's
    ``ShapeEnv`` (``cuvil_ir.graph_ir.fake``), whose module imports ``torch._dynamo``
    internally (about 0.7 s); Cuvil calls nothing from ``torch._dynamo``,
    ``torch.export`` or ``torch.compile``. ``CUVIL_PRELOAD=0`` turns this off."""
    try:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        ShapeEnv()
    except Exception:  # the first capture will import (and report) it again
        pass


_PRELOAD: Any = None  # the background import thread, when started


def _start_preload() -> None:
    import os
    import threading

    global _PRELOAD
    if os.environ.get("CUVIL_PRELOAD", "1") != "0":
        import sysconfig

        # Python 3.11 fills sysconfig's table lazily and not thread-safely: a caller on the
        # main thread (triton's import, in the cuda target's check) could read a half-filled
        # table (``EXE`` None) while the preload's imports fill it. Fill it here, first.
        sysconfig.get_config_vars()
        _PRELOAD = threading.Thread(target=_preload, name="cuvil-preload", daemon=True)
        _PRELOAD.start()


def warmup() -> float:
    """Finish the one-time imports the first capture needs (torch's ShapeEnv brings in
    ``torch._dynamo``, about 0.7 s, started in the background by ``import cuvil``);
    returns the seconds spent waiting. Call it at startup so that the first compiled
    call pays only for compiling (or, with a warm cache, loading)."""
    import time

    t0 = time.perf_counter()
    if _PRELOAD is not None:
        _PRELOAD.join()
    else:
        _preload()
    return time.perf_counter() - t0


_start_preload()


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
    "SourceLoc",
    "Stats",
    "backends",
    "compile",
    "compile_onnx",
    "custom_op",
    "explain",
    "export_onnx",
    "reload_plugins",
    "run_mlir",
    "to_mlir",
    "warmup",
]
