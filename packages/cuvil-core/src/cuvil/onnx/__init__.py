"""ONNX export and import for Cuvil (needs ``pip install 'cuvil[onnx]'``).

``export_onnx(f, *example_args, path=None)`` captures ``f`` and writes its Graph IR
as an ONNX model; ``compile_onnx(model_or_path, target=None)`` reads an ONNX model
into Graph IR and compiles it with a Cuvil target. See ``docs/onnx.md``.
"""

from cuvil.onnx.api import compile_onnx, export_onnx

__all__ = ["compile_onnx", "export_onnx"]
