"""Custom ops as ONNX custom-domain nodes with their decomposition as a model-local function.

``cu.export_onnx(..., custom_ops="domain")`` writes a call of ``mylib::scaled_gelu`` as
one node ``scaled_gelu`` in domain ``mylib`` and adds a ``FunctionProto`` of that
name whose body is the op's region exported (the decomposition), so a runtime that
knows the op can run its own kernel and any other (onnxruntime included) runs the
function. Calls with different attributes or input types have different bodies:
each distinct body is an ``overload`` of the function (ONNX IR 10), named by a
digest of its canonical nodes. A body that needs something outside itself (a size
read from a graph input's shape) cannot be a closed function; that call is
exported inline instead (the default ``custom_ops="inline"`` does so for every call).

:class:`DomainFunctions` is the exporter's ``custom_ops`` writer: it uses only the
exporter's declared contract (:meth:`~cuvil.onnx.export.exporter.Exporter.separate_graph`,
``env``, ``block``, ``op``, ``val``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from cuvil.onnx.export.exporter import Exporter
from cuvil_ir.graph_ir.nodes import Node


class DomainFunctions:
    """Writes composite (custom) op calls as custom-domain nodes and collects the functions."""

    def __init__(self) -> None:
        #: (domain, name, overload) -> FunctionProto
        self.functions: dict[tuple[str, str, str], Any] = {}

    def __call__(self, ex: Exporter, n: Node) -> list[str] | None:
        """``n`` (a composite op's node) as a custom-domain node plus a function in
        :attr:`functions`; ``None`` when its body is not closed (the caller inlines it)."""
        (body,) = n.regions
        ns, short = n.op.split("::")
        inputs = [f"x{i}" for i in range(len(body.args))]
        with ex.separate_graph() as body_nodes:
            for a, name in zip(body.args, inputs):
                ex.env[a] = name
            ex.block(body.nodes)
            outputs = [ex.op("Identity", [ex.env[r]]) for r in body.results]
        nodes = list(body_nodes)
        made = set(inputs) | {o for nd in nodes for o in nd.output}
        if any(i and i not in made for nd in nodes for i in nd.input):
            return None  # reads a value from outside (a size): not a closed function
        names = _canonical(nodes, inputs, outputs)
        digest = hashlib.sha256(b"".join(nd.SerializeToString() for nd in nodes)).hexdigest()[:12]
        onnx = ex.onnx
        key = (ns, short, digest)
        if key not in self.functions:
            self.functions[key] = onnx.helper.make_function(
                ns,
                short,
                [names[i] for i in inputs],
                [names[o] for o in outputs],
                nodes,
                [onnx.helper.make_opsetid("", ex.opset)],
                overload=digest,
            )
        outs = ex.op(short, [ex.val(v) for v in n.inputs], n_out=len(n.outputs), domain=ns, overload=digest)
        return [outs] if len(n.outputs) == 1 else list(outs)


def _canonical(nodes: list[Any], inputs: list[str], outputs: list[str]) -> dict[str, str]:
    """Rename the function's values (``v0``, ``v1`` ... in order of appearance) and nodes
    (``f0`` ...) so that equal bodies serialize equally wherever they were exported."""
    names: dict[str, str] = {}

    def name(x: str) -> str:
        if x and x not in names:
            names[x] = f"v{len(names)}"
        return names.get(x, x)

    for x in inputs:
        name(x)
    for k, nd in enumerate(nodes):
        nd.name = f"f{k}"
        nd.input[:] = [name(x) for x in nd.input]
        nd.output[:] = [name(x) for x in nd.output]
    for x in outputs:
        name(x)
    return names


__all__ = ["DomainFunctions"]
