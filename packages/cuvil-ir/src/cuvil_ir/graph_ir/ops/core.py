"""Ops every graph may contain regardless of library: constants and extern calls."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cuvil_ir.graph_ir.fake import fake_call, materialize
from cuvil_ir.graph_ir.in_place import allowed as in_place_allowed
from cuvil_ir.graph_ir.nodes import AttrValue
from cuvil_ir.graph_ir.ops._rules import ShapeError
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.torch_names import resolve
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext, expr_str, prove


@contextlib.contextmanager
def autocast_entered(state: AttrValue) -> Iterator[None]:
    """``torch.autocast`` for each ``(device, dtype)`` of an extern's ``autocast``
    attribute (nothing for ``None``)."""
    with contextlib.ExitStack() as stack:
        if state:
            import torch

            for device, dtype in state:  # type: ignore[union-attr, misc]
                assert isinstance(dtype, DType)
                stack.enter_context(torch.autocast(str(device), dtype=dtype.torch))
        yield


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
    it first, so the node stays a pure function of its inputs. ``autocast``, on a call
    captured inside ``torch.autocast``, is ``((device, dtype), ...)``: the call runs (and
    its types are computed) under that autocast, as eager ran it, so the lower-precision
    ops inside a composite torch function (``einsum``'s ``bmm``) cast as they did.
    ``in_place``: the call may write operand ``mutates`` itself, no clone, when the run
    allows it ([Note: updates in place] in :mod:`cuvil_ir.graph_ir.in_place`).
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
        autocast: AttrValue = None,
        in_place: bool = False,
    ) -> tuple[Type, ...]:
        with autocast_entered(autocast):
            return tuple(fake_call(ctx, resolve(target), inputs, args, kwargs, target, mutates)[0])

    @staticmethod
    def reference(
        *inputs: Any,
        target: str,
        args: AttrValue,
        kwargs: AttrValue,
        mutates: int | None,
        autocast: AttrValue = None,
        in_place: bool = False,
    ) -> Any:
        import torch
        from torch.utils import _pytree as pytree

        refs = list(inputs)
        if mutates is not None and not (in_place and in_place_allowed()):
            refs[mutates] = refs[mutates].clone()
        fn = resolve(target)
        if autocast:
            with autocast_entered(autocast):
                out = fn(*materialize(args, refs), **materialize(kwargs, refs))
        else:  # (no context manager: a decode step runs dozens of these)
            out = fn(*materialize(args, refs), **materialize(kwargs, refs))
        if mutates is not None:
            return refs[mutates]
        if isinstance(out, torch.Tensor):
            return out
        return tuple(pytree.tree_leaves(out))


# [Note: data-dependent sizes]
# A size that only the data decides (the rows `nonzero` finds, `int(mask.sum())`) is a
# size symbol like any other (`u0`), with no example value: nothing may be decided about
# it at capture. It is bound at run time by the node that defines it: an output dim that
# is exactly a new symbol (`extern nonzero : Tensor[i64, (u0, 1)]`) is bound from the
# result's shape, and `bind_size` binds its `symbol` to a tensor's value
# (cuvil_ir.graph_ir.unbacked.defined_symbols). Facts torch needs of such a size are
# `assert_size` nodes, checked when they run. See docs/control-flow-and-dynamic-shapes.md.


class BindSize(Op):
    """The value of a one-element integer tensor, bound to the new size symbol ``symbol``
    (``n = int(mask.sum())`` used as a size); see [Note: data-dependent sizes]."""

    name = "bind_size"
    # not pure: later nodes use its symbol, not its result
    traits = frozenset({"data_dependent_size"})
    extern_reasons = {
        consumer: "binds a size symbol from tensor data when it runs"
        for consumer in ("tensor_ir", "mlir", "onnx")
    }

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, symbol: str) -> Type:
        if not isinstance(x, TensorType) or any(d != 1 for d in x.shape):
            raise ShapeError(f"bind_size takes a one-element tensor, got {x}")
        if x.dtype.is_floating or x.dtype.is_complex:
            raise ShapeError(f"a size must come from an integer tensor, got {x}")
        return ScalarType(ScalarKind.int)

    @staticmethod
    def reference(x: Any, *, symbol: str) -> int:
        value = int(x.item())
        if value < 0:
            raise ValueError(
                f"the size {symbol} computed from tensor data is {value}; a size cannot be negative"
            )
        return value


class AssertSize(Op):
    """A fact about data-dependent sizes that torch needed (``3 <= u0`` for ``topk(s, 3)``),
    checked when it runs: such a size has no example value to decide it at capture."""

    name = "assert_size"
    traits = frozenset({"data_dependent_size"})
    extern_reasons = {
        consumer: "checks sizes computed from tensor data when it runs"
        for consumer in ("tensor_ir", "mlir", "onnx")
    }
    num_outputs = 0

    @staticmethod
    def infer(ctx: ShapeContext, *, fact: Any, reason: str) -> tuple[Type, ...]:
        if prove(fact) is False:
            raise ShapeError(f"the size fact {expr_str(fact)} never holds ({reason})")
        return ()

    @staticmethod
    def reference(*, fact: Any, reason: str) -> tuple[Any, ...]:
        if fact is not True:  # the executor passes the fact evaluated at the bound sizes
            raise ValueError(f"sizes computed from tensor data break {reason}")
        return ()
