"""Matrix products: ``matmul`` (with torch.matmul's 1-D and batch-broadcasting rules) and ``linear``.

``mm``/``bmm``/``mv``/``dot`` are matmuls of fixed ranks, and ``addmm``/``baddbmm``
are a matmul plus a scaled add; their captures write them so, leaving one
library-kernel op for backends to implement (and epilogues to fuse).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops._rules import (
    LIBRARY_KERNEL,
    ShapeError,
    broadcast_shapes,
    check_equal,
    device_of,
    optional_inputs,
    same_dtype,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import TensorType, Type
from cuvil_ir.symbolic import Shape, ShapeContext

T = torch.Tensor


def matmul_shape(ctx: ShapeContext, a: Shape, b: Shape) -> Shape:
    """torch.matmul: 1-D operands gain (and then lose) a unit dim; batch dims broadcast."""
    if len(a) == 0 or len(b) == 0:
        raise ShapeError("matmul operands must have at least one dimension")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    check_equal(ctx, a2[-1], b2[-2], "matmul contraction size")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2])
    out = (*batch, *((a2[-2],) if len(a) > 1 else ()), *((b2[-1],) if len(b) > 1 else ()))
    return out


class Matmul(Op):
    name = "matmul"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.matmul,
            T.matmul,
            T.__matmul__,
            (T.__rmatmul__, lambda b, self, other: Matmul.capture(b, other, self)),
            (torch.mm, _ranked(2, 2)),
            (T.mm, _ranked(2, 2)),
            (torch.bmm, _ranked(3, 3)),
            (T.bmm, _ranked(3, 3)),
            (torch.mv, _ranked(2, 1)),
            (T.mv, _ranked(2, 1)),
            (torch.dot, _ranked(1, 1)),
            (T.dot, _ranked(1, 1)),
            (torch.addmm, _add_product(2)),
            (T.addmm, _add_product(2)),
            (torch.baddbmm, _add_product(3)),
            (T.baddbmm, _add_product(3)),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, other: Any, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        return b.emit("matmul", [input, other])

    @staticmethod
    def infer(ctx: ShapeContext, a: Type, b: Type) -> Type:
        ta, tb = tensor_of(a), tensor_of(b)
        return TensorType(
            same_dtype("matmul", ta, tb), matmul_shape(ctx, ta.shape, tb.shape), device_of(ta, tb)
        )

    @staticmethod
    def reference(a: Any, b: Any) -> Any:
        return torch.matmul(a, b)


def _ranked(ra: int, rb: int) -> Any:
    """mm/bmm/mv/dot: a matmul whose operands must have these ranks (and, for bmm,
    equal batch sizes: matmul would broadcast where bmm raises)."""

    def capture(b: Emitter, input: Any, other: Any, *, out: Any = None) -> Any:
        ta, tb = tensor_of(b.type_of(input)), tensor_of(b.type_of(other))
        if (ta.rank, tb.rank) != (ra, rb) or out is not None:
            raise NotCaptured("operand ranks torch rejects, or out=")
        if ra == 3 and not b.ctx.equal(ta.shape[0], tb.shape[0], "bmm batch size"):
            raise NotCaptured("bmm batch sizes differ")
        return b.emit("matmul", [input, other])

    return capture


def _add_product(rank: int) -> Any:
    """``beta * input + alpha * (m1 @ m2)`` (addmm for rank 2, baddbmm for rank 3)."""
    mm = _ranked(rank, rank)

    def capture(
        b: Emitter, input: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1, out: Any = None
    ) -> Any:
        t = tensor_of(b.type_of(input))
        if out is not None or t.rank > rank or b.is_value(beta) or b.is_value(alpha):
            raise NotCaptured("out=, traced scalars, or an input of higher rank")
        if t.dtype != tensor_of(b.type_of(m1)).dtype:
            raise NotCaptured("operands of different dtypes")  # torch raises; add would promote
        prod = mm(b, m1, m2)
        if alpha != 1:
            prod = b.emit("mul", [prod, alpha])
        if beta == 0:  # torch ignores input then, NaNs included
            return prod
        scaled = input if beta == 1 else b.emit("mul", [input, beta])
        return b.emit("add", [scaled, prod])

    return capture


class Linear(Op):
    """``x @ weight.T + bias``; a 1-D weight contracts away the last dim."""

    name = "linear"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.linear,)

    @staticmethod
    def capture(b: Emitter, input: Any, weight: Any, bias: Any = None) -> Any:
        bias_input, flags = optional_inputs(b, bias=bias)
        return b.emit("linear", [input, weight, *bias_input], **flags)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, w: Type, *bias: Type, has_bias: bool) -> Type:
        tx, tw = tensor_of(x), tensor_of(w)
        if len(bias) != int(has_bias) or tw.rank not in (1, 2) or tx.rank == 0:
            raise ShapeError(f"linear: weight of rank {tw.rank}, input of rank {tx.rank}, {len(bias)} biases")
        dtype = same_dtype("linear", tx, tw, *(tensor_of(t) for t in bias))
        check_equal(ctx, tx.shape[-1], tw.shape[-1], "linear in_features")
        shape = (*tx.shape[:-1], *tw.shape[:-1])
        if bias:
            if broadcast_shapes(ctx, shape, tensor_of(bias[0]).shape) != shape:
                raise ShapeError("linear: bias does not broadcast to the output")
        return TensorType(dtype, shape, device_of(tx, tw))

    @staticmethod
    def reference(x: Any, w: Any, *bias: Any, has_bias: bool) -> Any:
        return F.linear(x, w, bias[0] if has_bias else None)
