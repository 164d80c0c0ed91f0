"""``cu.to_mlir`` and ``cu.run_mlir``: a function's Graph IR as upstream MLIR, verified
by real MLIR, and run by MLIR's ExecutionEngine (an oracle independent of Cuvil's
targets). Needs ``pip install 'cuvil[mlir]'``; see docs/cuvil-ir-and-mlir.md.
"""

from __future__ import annotations

import importlib
from typing import Any


def _mlir() -> Any:
    try:
        return importlib.import_module("cuvil_ir.mlir")
    except ImportError as e:
        raise ImportError(
            f"MLIR emission needs the MLIR Python bindings: pip install 'cuvil[mlir]' ({e})"
        ) from e


def to_mlir(f: Any, *example_args: Any, **example_kwargs: Any) -> str:
    """The verified MLIR module (func, arith, math, tensor, linalg, scf) of ``f``'s graph
    for these example arguments; ops without an upstream form are calls to declared
    external functions (listed by ``cuvil_ir.mlir.to_mlir(graph).externs``)."""
    from cuvil.inspection import captured_call

    captured, _ = captured_call(f, *example_args, **example_kwargs)
    return str(_mlir().to_mlir(captured.graph).text)


def run_mlir(f: Any, *example_args: Any, **example_kwargs: Any) -> Any:
    """Run ``f``'s graph through MLIR: upstream lowering passes and the ExecutionEngine.
    Returns the graph's outputs (a tuple); raises for a graph with external calls."""
    from cuvil.inspection import captured_call

    captured, inputs = captured_call(f, *example_args, **example_kwargs)
    return _mlir().run_mlir(captured.graph, *inputs)


__all__ = ["run_mlir", "to_mlir"]
