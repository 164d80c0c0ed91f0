"""ONNX -> Graph IR, and :class:`OnnxFunction`: what ``cu.compile_onnx`` returns.

Each ONNX node is translated by the handler registered for its op type in :data:`OPS`
into registered Graph IR ops (output types come from each op's own shape rule, under a
``ShapeContext`` with the call's sizes as hints, so the size facts the graph relies on
become its assumptions, exactly as in tracing). An op type without a handler is an
:class:`OnnxImportError` naming the op type and the node.

The modules, in the order a model goes through them: :mod:`.runtime` (the callable: the
model's signature, one graph per size class), :mod:`.loader` (the :class:`Importer`: the
graph walk and the op table), :mod:`.folding` (values known when importing: shape
computations folded into attributes), the handlers by op family :mod:`.ops_elementwise`,
:mod:`.ops_shape`, :mod:`.ops_reduction`, :mod:`.ops_nn`, and :mod:`.control_flow`
(``If``, ``Loop``).
"""

# the handler modules fill OPS when imported
from cuvil.onnx.import_ import control_flow, ops_elementwise, ops_nn, ops_reduction, ops_shape  # noqa: F401
from cuvil.onnx.import_.loader import OPS, Importer, OnnxImportError
from cuvil.onnx.import_.runtime import OnnxFunction

__all__ = ["OPS", "Importer", "OnnxFunction", "OnnxImportError"]
