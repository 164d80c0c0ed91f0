"""Cuvil's CPU target: Graph IR -> Tensor IR -> Loop IR -> C with OpenMP and SIMD.

The target registers through the ``cuvil.backends`` entry point ``cpu``
(:data:`cuvil_backend_cpu.backend.BACKEND`); importing this package is cheap.
"""

__version__ = "0.1.0"
