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
