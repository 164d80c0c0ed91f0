"""Ops every graph may contain regardless of library: constants and extern calls."""

from __future__ import annotations

from typing import Any

from cuvil_ir.graph_ir.fake import fake_call, materialize
from cuvil_ir.graph_ir.nodes import AttrValue
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.torch_names import resolve
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, Type
from cuvil_ir.symbolic import ShapeContext


class Const(Op):
    """A Python scalar (possibly a size expression) used as an operand."""

    name = "const"
    traits = frozenset({"pure"})

    @staticmethod
    def infer(ctx: ShapeContext, *, value: Any) -> Type:
        return ScalarType(ScalarKind.of(value))

    @staticmethod
    def reference(*, value: Any) -> Any:
        return value


class Extern(Op):
    """A torch call without a Graph IR declaration, run as is at run time.

    ``args``/``kwargs`` are attribute trees in which ``$i`` stands for input i.
    Output types come from torch's fake kernels (:mod:`cuvil_ir.graph_ir.fake`).
    ``mutates`` names the input an in-place call writes to: the reference clones
    it first, so the node stays a pure function of its inputs.
    """

    name = "extern"
    traits = frozenset({"opaque"})
    extern_reasons = {
        consumer: "an opaque torch call: it runs as itself (ONNX export cannot name it)"
        for consumer in ("tensor_ir", "mlir", "onnx")
    }
    num_outputs = None

    @staticmethod
    def infer(
        ctx: ShapeContext,
        *inputs: Type,
        target: str,
        args: AttrValue,
        kwargs: AttrValue,
        mutates: int | None,
    ) -> tuple[Type, ...]:
        return tuple(fake_call(ctx, resolve(target), inputs, args, kwargs, target, mutates)[0])

    @staticmethod
    def reference(*inputs: Any, target: str, args: AttrValue, kwargs: AttrValue, mutates: int | None) -> Any:
        import torch
        from torch.utils import _pytree as pytree

        refs = list(inputs)
        if mutates is not None:
            refs[mutates] = refs[mutates].clone()
        out = resolve(target)(*materialize(args, refs), **materialize(kwargs, refs))
        if mutates is not None:
            return refs[mutates]
        if isinstance(out, torch.Tensor):
            return out
        return tuple(pytree.tree_leaves(out))
