"""A template for a Cuvil target, built only on the public plugin contract.

Copy this distribution to start a target of your own (docs/plugins.md). The
``example`` target lowers every graph through the shared Tensor IR pipeline with
its own fusion policy, turns each kernel into Triton text with the shared
generator under its own rules, and runs the kernels in Triton's interpreter on
CPU tensors (``TRITON_INTERPRET=1``). A real accelerator's target would compile
them for its device instead (see the ``cuda`` and ``ascend`` targets).
"""

__version__ = "0.1.0"
