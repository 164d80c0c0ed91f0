"""Graph IR as upstream MLIR (func, arith, math, tensor, linalg, scf), and an ExecutionEngine runner.

The MLIR Python bindings are optional (``pip install 'cuvil-ir[mlir]'``) and imported
only by :mod:`cuvil_ir.mlir.bindings`. See ``docs/cuvil-ir-and-mlir.md``.
"""

from cuvil_ir.mlir.emit import MlirResult, to_mlir, to_mlir_text
from cuvil_ir.mlir.module import MlirError
from cuvil_ir.mlir.run import run_mlir

__all__ = ["MlirError", "MlirResult", "run_mlir", "to_mlir", "to_mlir_text"]
