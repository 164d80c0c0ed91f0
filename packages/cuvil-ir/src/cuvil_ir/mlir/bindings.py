"""The one place that imports MLIR Python bindings.

Tries the bindings shipped by torch-mlir first (``torch_mlir.ir`` ...), then the
upstream distribution (``mlir.ir`` ...). Everything else in :mod:`cuvil_ir.mlir`
goes through :func:`load`, so another build of the upstream bindings can be
swapped in here alone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

INSTALL_HINT = "pip install 'cuvil-ir[mlir]'"
_PREFIXES = ("torch_mlir", "mlir")


@dataclass(frozen=True)
class Bindings:
    """The binding modules: ``ir``, ``passmanager``, ``execution_engine``."""

    prefix: str
    ir: Any
    passmanager: Any
    execution_engine: Any


@lru_cache(maxsize=1)
def load() -> Bindings:
    """The first available MLIR Python bindings; ``ImportError`` with an install hint if none."""
    errors: list[str] = []
    for prefix in _PREFIXES:
        try:
            ir = importlib.import_module(f"{prefix}.ir")
            pm = importlib.import_module(f"{prefix}.passmanager")
            ee = importlib.import_module(f"{prefix}.execution_engine")
        except ImportError as e:
            errors.append(f"{prefix}: {e}")
            continue
        return Bindings(prefix, ir, pm, ee)
    raise ImportError(
        "no MLIR Python bindings found (tried " + "; ".join(errors) + f"); install them with {INSTALL_HINT}"
    )


def available() -> bool:
    try:
        load()
    except ImportError:
        return False
    return True
