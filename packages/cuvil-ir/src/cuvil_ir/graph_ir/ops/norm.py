"""Normalisations: softmax, log_softmax, layer/RMS/batch(inference)/group norm.

Optional affine parameters follow the data input, only when present; the
``has_weight``/``has_bias`` attributes say which ones are there, since a lone
parameter could be either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops._rules import (
    ShapeError,
    check_divisible,
    check_equal,
    dim_arg,
    dtype_arg,
    int_arg,
    size_arg,
    size_args,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext

T = torch.Tensor


def _affine(b: Emitter, weight: Any, bias: Any = None) -> tuple[list[Any], dict[str, bool]]:
    for p in (weight, bias):
        if p is not None and not b.is_value(p):
            raise NotCaptured("affine parameters must be tensors")
    return [p for p in (weight, bias) if p is not None], {
        "has_weight": weight is not None,
        "has_bias": bias is not None,
    }


def _unpack(params: Sequence[Any], has_weight: bool, has_bias: bool) -> tuple[Any, Any]:
    it = iter(params)
    weight = next(it) if has_weight else None
    bias = next(it) if has_bias else None
    return weight, bias


def _check_params(
    ctx: ShapeContext, params: Sequence[Type], flags: Sequence[bool], shape: Sequence[Dim], what: str
) -> None:
    if len(params) != sum(flags):
        raise ShapeError(f"{what}: {len(params)} parameter inputs for flags {tuple(flags)}")
    for p in params:
        t = tensor_of(p, f"{what} parameter")
        if t.rank != len(shape):
            raise ShapeError(f"{what}: parameter of rank {t.rank}, expected {len(shape)}")
        for a, e in zip(t.shape, shape):
            check_equal(ctx, a, e, f"{what} parameter size")


def _float_input(x: Type, what: str) -> TensorType:
    t = tensor_of(x)
    if not t.dtype.is_floating:
        raise ShapeError(f"{what} of a {t.dtype.value} tensor (torch takes float tensors)")
    return t


# -- softmax --------------------------------------------------------------------------
def _softmax(name: str, fn: Any, functional: Any, methods: tuple[Any, ...]) -> type[Op]:
    def capture(b: Emitter, input: Any, dim: Any, dtype: Any = None, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        if dim is None:
            raise NotCaptured(f"{name} without dim (deprecated implicit choice)")
        t = tensor_of(b.type_of(input))
        return b.emit(name, [input], dim=dim_arg(dim, t.rank), dtype=dtype_arg(dtype))

    def capture_functional(
        b: Emitter, input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None
    ) -> Any:
        return capture(b, input, dim, dtype)

    def infer(ctx: ShapeContext, x: Type, *, dim: int, dtype: DType | None) -> Type:
        t = tensor_of(x)
        if not 0 <= dim < max(t.rank, 1):
            raise ShapeError(f"dim {dim} out of range for rank {t.rank}")
        out = dtype or t.dtype
        if not out.is_floating:
            raise ShapeError(f"{name} of a {out.value} tensor")
        return t.replace(dtype=out)

    def reference(x: Any, *, dim: int, dtype: DType | None) -> Any:
        return fn(x, dim, dtype=dtype.torch if dtype is not None else None)

    ns = {
        "name": name,
        "traits": frozenset({"pure"}),
        "torch": staticmethod(lambda: (*methods, (functional, capture_functional))),
        "capture": staticmethod(capture),
        "infer": staticmethod(infer),
        "reference": staticmethod(reference),
    }
    return type(name.title().replace("_", ""), (Op,), ns)


_softmax("softmax", torch.softmax, F.softmax, (torch.softmax, T.softmax, torch.special.softmax))
_softmax(
    "log_softmax",
    torch.log_softmax,
    F.log_softmax,
    (torch.log_softmax, T.log_softmax, torch.special.log_softmax),
)


# -- layer norm, RMS norm --------------------------------------------------------------
def _normalized_shape(v: Any) -> tuple[Dim, ...]:
    return tuple(size_arg(d) for d in size_args((v,)))


def _check_trailing(ctx: ShapeContext, t: TensorType, shape: tuple[Dim, ...], what: str) -> None:
    if len(shape) == 0 or t.rank < len(shape):
        raise ShapeError(f"{what}: normalized_shape {shape} does not fit rank {t.rank}")
    for a, e in zip(t.shape[t.rank - len(shape) :], shape):
        check_equal(ctx, a, e, f"{what} normalized size")


class LayerNorm(Op):
    name = "layer_norm"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.layer_norm,)

    @staticmethod
    def capture(
        b: Emitter, input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5
    ) -> Any:
        params, flags = _affine(b, weight, bias)
        return b.emit(
            "layer_norm",
            [input, *params],
            normalized_shape=_normalized_shape(normalized_shape),
            eps=float(eps),
            **flags,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *params: Type,
        normalized_shape: tuple[Dim, ...],
        eps: float,
        has_weight: bool,
        has_bias: bool,
    ) -> Type:
        t = _float_input(x, "layer_norm")
        _check_trailing(ctx, t, normalized_shape, "layer_norm")
        _check_params(ctx, params, (has_weight, has_bias), normalized_shape, "layer_norm")
        return t

    @staticmethod
    def reference(
        x: Any, *params: Any, normalized_shape: tuple[int, ...], eps: float, has_weight: bool, has_bias: bool
    ) -> Any:
        return F.layer_norm(x, normalized_shape, *_unpack(params, has_weight, has_bias), eps)


class RmsNorm(Op):
    name = "rms_norm"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.rms_norm,)

    @staticmethod
    def capture(b: Emitter, input: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
        params, flags = _affine(b, weight)
        return b.emit(
            "rms_norm",
            [input, *params],
            normalized_shape=_normalized_shape(normalized_shape),
            eps=None if eps is None else float(eps),
            has_weight=flags["has_weight"],
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *params: Type,
        normalized_shape: tuple[Dim, ...],
        eps: float | None,
        has_weight: bool,
    ) -> Type:
        t = _float_input(x, "rms_norm")
        _check_trailing(ctx, t, normalized_shape, "rms_norm")
        _check_params(ctx, params, (has_weight,), normalized_shape, "rms_norm")
        return t

    @staticmethod
    def reference(
        x: Any, *params: Any, normalized_shape: tuple[int, ...], eps: float | None, has_weight: bool
    ) -> Any:
        return F.rms_norm(x, normalized_shape, params[0] if has_weight else None, eps)


# -- batch norm (inference), group norm --------------------------------------------------
class BatchNorm(Op):
    """Batch norm with running statistics (eval mode); inputs ``x, mean, var[, weight][, bias]``."""

    name = "batch_norm"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.batch_norm,)

    @staticmethod
    def capture(
        b: Emitter,
        input: Any,
        running_mean: Any,
        running_var: Any,
        weight: Any = None,
        bias: Any = None,
        training: bool = False,
        momentum: Any = 0.1,
        eps: Any = 1e-5,
    ) -> Any:
        if training:
            raise NotCaptured("train-mode batch_norm computes batch statistics and updates running stats")
        if not (b.is_value(running_mean) and b.is_value(running_var)):
            raise NotCaptured("eval-mode batch_norm without running statistics")
        params, flags = _affine(b, weight, bias)
        return b.emit("batch_norm", [input, running_mean, running_var, *params], eps=float(eps), **flags)

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        mean: Type,
        var: Type,
        *params: Type,
        eps: float,
        has_weight: bool,
        has_bias: bool,
    ) -> Type:
        t = _float_input(x, "batch_norm")
        if t.rank < 2:
            raise ShapeError(f"batch_norm needs at least 2 dimensions, got {t.rank}")
        channels = (t.shape[1],)
        _check_params(ctx, (mean, var), (True, True), channels, "batch_norm statistics")
        _check_params(ctx, params, (has_weight, has_bias), channels, "batch_norm")
        return t

    @staticmethod
    def reference(
        x: Any, mean: Any, var: Any, *params: Any, eps: float, has_weight: bool, has_bias: bool
    ) -> Any:
        return F.batch_norm(x, mean, var, *_unpack(params, has_weight, has_bias), False, 0.0, eps)


class GroupNorm(Op):
    name = "group_norm"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.group_norm,)

    @staticmethod
    def capture(
        b: Emitter, input: Any, num_groups: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5
    ) -> Any:
        params, flags = _affine(b, weight, bias)
        return b.emit(
            "group_norm",
            [input, *params],
            num_groups=int_arg(num_groups, "num_groups"),
            eps=float(eps),
            **flags,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *params: Type,
        num_groups: int,
        eps: float,
        has_weight: bool,
        has_bias: bool,
    ) -> Type:
        t = _float_input(x, "group_norm")
        if t.rank < 2 or num_groups <= 0:
            raise ShapeError(f"group_norm of rank {t.rank} with {num_groups} groups")
        check_divisible(ctx, t.shape[1], num_groups, "group_norm channels divisible by groups")
        _check_params(ctx, params, (has_weight, has_bias), (t.shape[1],), "group_norm")
        return t

    @staticmethod
    def reference(x: Any, *params: Any, num_groups: int, eps: float, has_weight: bool, has_bias: bool) -> Any:
        return F.group_norm(x, num_groups, *_unpack(params, has_weight, has_bias), eps)
