"""Graph IR -> ONNX (``onnx.ModelProto``).

Every Graph IR value becomes an ONNX value; every node becomes one or a few ONNX
nodes (the table :data:`OPS`). Size symbols are read once from the graph inputs
(``Shape(x, start=i, end=i+1)``) and size expressions in attributes and ``const``
nodes are computed from them with integer ONNX arithmetic, so the model keeps
the graph's dynamic axes; graph input and output dims are ``dim_param`` s named
after the symbols (``x_0``). ``if`` becomes ``If``; ``for`` and ``while`` become
``Loop``. Python scalars (``Scalar[...]``) are 0-d tensors (int64, double, bool),
cast to the operand dtype at each use, as torch's weak-scalar promotion does.

The output is deterministic: value and node names are numbered in program order.

The modules, in the order a node goes through them: :mod:`.builder` (ONNX nodes,
scopes, constants), :mod:`.sizes` (size expressions), :mod:`.exporter` (the Graph IR
walk and the op table), the op families :mod:`.elementwise`, :mod:`.reduction`,
:mod:`.shape`, :mod:`.nn`, :mod:`.control_flow`, and :mod:`.model` (the model around
the graph). A primitive ONNX has no op for (rsqrt ..., sdpa) has no entry: it is written as
its fallback decomposition (:mod:`cuvil_ir.graph_ir.fallbacks`).
"""

# the op-family modules fill OPS when imported
from cuvil.onnx.export import control_flow, elementwise, nn, reduction, shape  # noqa: F401
from cuvil.onnx.export.builder import OPSET, ExportError, onnx_dtype
from cuvil.onnx.export.exporter import OPS, Exporter
from cuvil.onnx.export.model import export_graph

__all__ = ["OPS", "OPSET", "ExportError", "Exporter", "export_graph", "onnx_dtype"]
