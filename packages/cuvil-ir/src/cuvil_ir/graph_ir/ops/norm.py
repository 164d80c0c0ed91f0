"""Normalisations: softmax, log_softmax, layer/RMS/batch(inference)/group norm.

Each declares its math once, as a decomposition into reductions and elementwise ops
(:mod:`cuvil_ir.graph_ir.decompose`), in the numerically stable forms: softmax
subtracts the row maximum, variances are taken around the mean (two passes). Lowered
from these, a softmax or a layer norm is one kernel per row: the reductions are
hoisted into it (docs/tensor-and-loop-ir.md).

Optional affine parameters follow the data input, only when present; the
``has_weight``/``has_bias`` attributes say which ones are there (see
:func:`~cuvil_ir.graph_ir.ops._rules.optional_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.decompose import Builder, Sym
from cuvil_ir.graph_ir.ops._rules import (
    ShapeError,
    check_divisible,
    check_equal,
    check_optional,
    declare,
    dim_arg,
    dtype_arg,
    float_tensor,
    floordiv,
    int_arg,
    numel,
    optional_args,
    optional_inputs,
    size_arg,
    size_args,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext

T = torch.Tensor


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

    def decompose(b: Builder, x: Sym, *, dim: int, dtype: DType | None) -> Sym:
        if dtype is not None:
            x = b.upcast(x.cast(dtype))
        shifted = x - x.amax((dim,), keepdim=True)
        e = shifted.exp()
        s = e.sum((dim,), keepdim=True)
        return shifted - s.log() if name == "log_softmax" else e / s

    return declare(
        name,
        traits={"pure"},
        torch=lambda: (*methods, (functional, capture_functional)),
        capture=capture,
        infer=infer,
        reference=reference,
        decompose=decompose,
    )


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
        params, flags = optional_inputs(b, weight=weight, bias=bias)
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
        t = float_tensor(x, "layer_norm")
        _check_trailing(ctx, t, normalized_shape, "layer_norm")
        check_optional(ctx, params, (has_weight, has_bias), normalized_shape, "layer_norm")
        return t

    @staticmethod
    def reference(
        x: Any, *params: Any, normalized_shape: tuple[int, ...], eps: float, has_weight: bool, has_bias: bool
    ) -> Any:
        return F.layer_norm(
            x, normalized_shape, eps=eps, **optional_args(params, weight=has_weight, bias=has_bias)
        )

    @staticmethod
    def decompose(
        b: Builder,
        x: Sym,
        *params: Sym,
        normalized_shape: tuple[Dim, ...],
        eps: float,
        has_weight: bool,
        has_bias: bool,
    ) -> Sym:
        dims = tuple(range(x.rank - len(normalized_shape), x.rank))
        centred = x - x.mean(dims, keepdim=True)
        y = centred * ((centred * centred).mean(dims, keepdim=True) + eps).rsqrt()
        return _affine(y, params, has_weight, has_bias)


class RmsNorm(Op):
    name = "rms_norm"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.rms_norm,)

    @staticmethod
    def capture(b: Emitter, input: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
        params, flags = optional_inputs(b, weight=weight)
        return b.emit(
            "rms_norm",
            [input, *params],
            normalized_shape=_normalized_shape(normalized_shape),
            eps=None if eps is None else float(eps),
            **flags,
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
        t = float_tensor(x, "rms_norm")
        _check_trailing(ctx, t, normalized_shape, "rms_norm")
        check_optional(ctx, params, (has_weight,), normalized_shape, "rms_norm")
        return t

    @staticmethod
    def reference(
        x: Any, *params: Any, normalized_shape: tuple[int, ...], eps: float | None, has_weight: bool
    ) -> Any:
        return F.rms_norm(x, normalized_shape, eps=eps, **optional_args(params, weight=has_weight))

    @staticmethod
    def decompose(
        b: Builder,
        x: Sym,
        *params: Sym,
        normalized_shape: tuple[Dim, ...],
        eps: float | None,
        has_weight: bool,
    ) -> Sym:
        if eps is None:  # torch's default: the machine epsilon of the input's dtype
            eps = float(torch.finfo(tensor_of(b.out_type()).dtype.torch).eps)
        dims = tuple(range(x.rank - len(normalized_shape), x.rank))
        y = x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt()
        return _affine(y, params, has_weight, False)


def _affine(y: Sym, params: Sequence[Sym], has_weight: bool, has_bias: bool) -> Sym:
    """``y * weight + bias``, each factor only when present."""
    it = iter(params)
    if has_weight:
        y = y * next(it)
    if has_bias:
        y = y + next(it)
    return y


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
        params, flags = optional_inputs(b, weight=weight, bias=bias)
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
        t = float_tensor(x, "batch_norm")
        if t.rank < 2:
            raise ShapeError(f"batch_norm needs at least 2 dimensions, got {t.rank}")
        channels = (t.shape[1],)
        check_optional(ctx, (mean, var), (True, True), channels, "batch_norm statistics")
        check_optional(ctx, params, (has_weight, has_bias), channels, "batch_norm")
        return t

    @staticmethod
    def reference(
        x: Any, mean: Any, var: Any, *params: Any, eps: float, has_weight: bool, has_bias: bool
    ) -> Any:
        affine = optional_args(params, weight=has_weight, bias=has_bias)
        return F.batch_norm(x, mean, var, training=False, momentum=0.0, eps=eps, **affine)

    @staticmethod
    def decompose(
        b: Builder, x: Sym, mean: Sym, var: Sym, *params: Sym, eps: float, has_weight: bool, has_bias: bool
    ) -> Sym:
        def channel(p: Sym) -> Sym:  # (C,) -> (C, 1, ..., 1): broadcasts over (N, C, ...)
            for _ in range(x.rank - 2):
                p = p.unsqueeze(p.rank)
            return p

        y = (x - channel(mean)) * (channel(var) + eps).rsqrt()
        return _affine(y, [channel(p) for p in params], has_weight, has_bias)


class GroupNorm(Op):
    name = "group_norm"
    traits = frozenset({"pure"})
    extern_reasons = {
        # Lowered from the decomposition, the statistics of each (sample, group) view x
        # as (N, G, C/G * H * W); a kernel computing x (a convolution's bias add, say)
        # must then be realized first, and the result reshaped back: more kernels than
        # the one library call this op is today, and not measured faster.
        "tensor_ir": "torch's group_norm kernel: the decomposition needs x viewed per group",
    }

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.group_norm,)

    @staticmethod
    def capture(
        b: Emitter, input: Any, num_groups: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5
    ) -> Any:
        params, flags = optional_inputs(b, weight=weight, bias=bias)
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
        t = float_tensor(x, "group_norm")
        if t.rank < 2 or num_groups <= 0:
            raise ShapeError(f"group_norm of rank {t.rank} with {num_groups} groups")
        check_divisible(ctx, t.shape[1], num_groups, "group_norm channels divisible by groups")
        check_optional(ctx, params, (has_weight, has_bias), (t.shape[1],), "group_norm")
        return t

    @staticmethod
    def reference(x: Any, *params: Any, num_groups: int, eps: float, has_weight: bool, has_bias: bool) -> Any:
        return F.group_norm(x, num_groups, eps=eps, **optional_args(params, weight=has_weight, bias=has_bias))

    @staticmethod
    def decompose(
        b: Builder, x: Sym, *params: Sym, num_groups: int, eps: float, has_weight: bool, has_bias: bool
    ) -> Sym:
        n, c, *rest = x.shape
        per_group = floordiv(c, num_groups) * numel(tuple(rest))
        xg = x.reshape((n, num_groups, per_group if isinstance(per_group, int) else sympy.expand(per_group)))
        centred = xg - xg.mean((2,), keepdim=True)
        y = centred * ((centred * centred).mean((2,), keepdim=True) + eps).rsqrt()
        channel = [p.reshape((c,) + (1,) * len(rest)) for p in params]
        return _affine(y.reshape(x.shape), channel, has_weight, has_bias)
