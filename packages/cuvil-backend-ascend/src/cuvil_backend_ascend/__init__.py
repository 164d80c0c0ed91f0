"""Cuvil's Ascend target: Graph IR -> Tensor IR -> Triton-Ascend kernels under the NPU's rules.

The target registers through the ``cuvil.backends`` entry point ``ascend``
(:data:`cuvil_backend_ascend.backend.BACKEND`); importing this package is cheap
(triton is imported when the target is first used). It depends on neither triton,
triton-ascend nor torch-npu: on an Ascend host the vendor stack provides them. With
``CUVIL_ASCEND_SIM=1`` (``pip install 'cuvil-backend-ascend[sim]'``) the target runs
every kernel in upstream Triton's interpreter on CPU tensors, under the same launch
rules (docs/ascend-backend.md).
"""

__version__ = "0.1.0"
