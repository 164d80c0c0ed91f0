"""Triton source text from Tensor IR, shared by the Triton targets (``cuda``, ``ascend``).

Emits text only and imports no ``triton``: a target brings its own Triton and binds
the device library ``cu`` the text calls (:mod:`cuvil_ir.triton_source.functions`).
"""
