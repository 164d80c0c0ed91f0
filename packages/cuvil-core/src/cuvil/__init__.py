"""Cuvil: a Python-native compiler for PyTorch inference.

import cuvil as cu

@cu.compile
def f(x, y):
    return torch.softmax(x @ y + 1.0, dim=-1).sum(0)
"""

from __future__ import annotations

from typing import Any

from cuvil.api import CompiledFunction, CuvilFallbackWarning, Stats, compile, explain
from cuvil.errors import CompileError, SourceLoc

__version__ = "0.1.0"


def _preload() -> None:
    """Import what the first capture needs (torch's ShapeEnv pulls in torch._dynamo,
    about 0.8 s) while the caller builds its model, so the first compiled call does
    not pay for it. ``CUVIL_PRELOAD=0`` turns this off."""
    try:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        ShapeEnv()
    except Exception:  # the first capture will import (and report) it again
        pass


def _start_preload() -> None:
    import os
    import threading

    if os.environ.get("CUVIL_PRELOAD", "1") != "0":
        threading.Thread(target=_preload, name="cuvil-preload", daemon=True).start()


_start_preload()


def backends() -> list[Any]:
    """Every discovered target: name, available, reason (and where it comes from)."""
    from cuvil_runtime.registry import discover

    return discover()


__all__ = [
    "CompileError",
    "CompiledFunction",
    "CuvilFallbackWarning",
    "SourceLoc",
    "Stats",
    "backends",
    "compile",
    "explain",
]
