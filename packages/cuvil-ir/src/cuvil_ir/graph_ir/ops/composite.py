"""Composite ops: an op whose decomposition is the region it carries.

A user- or plugin-declared operator (``cu.custom_op("mylib::scaled_gelu")``) is a
node named ``namespace::name`` whose one region is its decomposition, captured
from the op's torch reference at the node's own (symbolic) input types::

    %r = mylib::scaled_gelu(%x) {alpha = 2.0} (
      ^0(%a: Tensor[f32, (x_0, x_1), cpu]) { %b = gelu(%a) ...; %c = mul(%b, %k); yield %c }
    ) : Tensor[f32, (x_0, x_1), cpu]

The region takes the node's operands and yields its results, so every consumer
that expands decompositions (Tensor IR lowering, MLIR emission, ONNX export:
:func:`cuvil_ir.graph_ir.decompose.expand`) inlines it and fuses its primitives
with the neighbours; the reference executor calls the op's torch reference (the
independent oracle). Because the decomposition is in the graph's text, a changed
definition changes the graph's text and hash, and so every cache key built on them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.registry import REGISTRY, CaptureRule, Op
from cuvil_ir.graph_ir.verifier import RegionChecker, types_equal

#: the traits of every composite op (``composite``: its region is its decomposition)
COMPOSITE = frozenset({"composite", "pure"})


def _check_body(node: Node, c: RegionChecker) -> None:
    if len(node.regions) != 1:
        raise c.error(f"a composite op carries one region (its decomposition), got {len(node.regions)}")
    (body,) = node.regions
    c.block(body)
    if len(body.args) != len(node.inputs) or not all(
        types_equal(a.type, v.type) for a, v in zip(body.args, node.inputs)
    ):
        raise c.error("the region's arguments must have the types of the node's operands")
    if len(body.results) != len(node.outputs) or not all(
        types_equal(r.type, v.type) for r, v in zip(body.results, node.outputs)
    ):
        raise c.error("the region must yield the node's result types")


def _from_region(b: Any, *inputs: Any, **attrs: Any) -> Any:
    """The decomposition of every composite op: its node's region, which
    :func:`cuvil_ir.graph_ir.decompose.expand` inlines (so this is never called)."""
    raise AssertionError("expand() inlines a composite node's region")


class Composite(Op):
    """Base of composite op declarations (made by :func:`declare_composite`)."""

    traits = COMPOSITE
    num_outputs = None
    check_regions = staticmethod(_check_body)
    #: the names of the tensor operands (a native lowering's first parameters)
    operands: tuple[str, ...] = ()
    decompose = staticmethod(_from_region)


class Opaque(Op):
    """Base of custom ops declared with a shape function instead of a capturable
    reference: no region, result types from the shape function, run as the reference
    (an extern call) except where a target has a native lowering."""

    traits = frozenset({"pure"})
    num_outputs = None
    operands: tuple[str, ...] = ()
    extern_reasons = {
        "tensor_ir": "declared with a shape function: its reference is not captured, so it runs as a call",
        "mlir": "declared with a shape function: there is no decomposition to emit",
        "onnx": "declared with a shape function: there is no decomposition to export",
    }


def declare_custom_op(
    name: str,
    reference: Callable[..., Any],
    attrs: Sequence[str] = (),
    *,
    operands: Sequence[str] = (),
    lowerings: Sequence[str] = (),
    infer: Callable[..., Any] | None = None,
    results: int | None = None,
    torch_callables: Sequence[Any] = (),
    capture: CaptureRule | None = None,
    replace: bool = False,
) -> type[Op]:
    """Register the custom op ``name`` (``namespace::name``) whose attributes are
    ``attrs`` and whose eager implementation is ``reference``: a composite op (its
    region is its decomposition) or, given ``infer(ctx, *input_types, **attrs)``, an
    opaque one (:class:`Opaque`) with ``results`` results. Calls of ``torch_callables`` are recorded by
    ``capture``. ``operands`` names the tensor operands; ``lowerings`` names the
    targets with a native lowering, each an attribute ``lower_<target>`` holding its
    text (see [Note: native calls] in :mod:`cuvil_ir.tensor_ir.expr`). ``replace``
    swaps an earlier declaration of the same name from the same module (a module run
    again)."""
    if "::" not in name or not all(part.isidentifier() for part in name.split("::")):
        raise ValueError(f"a custom op is named 'namespace::name' (identifiers), got {name!r}")

    def own(kwargs: dict[str, Any]) -> dict[str, Any]:  # the lowerings' texts are not the op's
        return {k: v for k, v in kwargs.items() if not k.startswith("lower_")}

    def rule(ctx: Any, *inputs: Any, **kwargs: Any) -> Any:
        if infer is None:
            raise TypeError(f"{name}: result types come from its region (the verifier calls check_regions)")
        return infer(ctx, *inputs, **own(kwargs))

    def run(*inputs: Any, **kwargs: Any) -> Any:
        return reference(*inputs, **own(kwargs))

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY),
        inspect.Parameter("inputs", inspect.Parameter.VAR_POSITIONAL),
        *(inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY) for a in attrs),
        *(inspect.Parameter(f"lower_{t}", inspect.Parameter.KEYWORD_ONLY) for t in lowerings),
    ]
    rule.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    module = str(getattr(reference, "__module__", __name__))
    code = getattr(inspect.unwrap(reference), "__code__", None)
    base: type[Op] = Composite if infer is None else Opaque
    body: dict[str, Any] = {
        "name": name,
        "infer": staticmethod(rule),
        "reference": staticmethod(run),
        "operands": tuple(operands),
        "torch": staticmethod(lambda: tuple(torch_callables)),
        "__module__": module,
        "__qualname__": f"{base.__name__}[{name}]",
        #: the declaration's file:line (what errors about the op name)
        "declared_at": f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "",
    }
    if capture is not None:
        body["capture"] = staticmethod(capture)
    if infer is not None:
        body["num_outputs"] = results
    if replace and name in REGISTRY:
        REGISTRY.remove(name, origin=module)
    return type(f"{base.__name__}_{name.replace('::', '__')}", (base,), body)


__all__ = ["COMPOSITE", "Composite", "Opaque", "declare_custom_op"]
