"""Cuvil's CUDA target: Graph IR -> Tensor IR -> Triton kernels, replayed as CUDA Graphs.

The target registers through the ``cuvil.backends`` entry point ``cuda``
(:data:`cuvil_backend_cuda.backend.BACKEND`); importing this package is cheap
(triton is imported when the target is first used). With ``TRITON_INTERPRET=1``
the target runs every kernel through Triton's interpreter on CPU tensors (the
test mode; docs/cuda-backend.md).
"""

__version__ = "0.1.0"
