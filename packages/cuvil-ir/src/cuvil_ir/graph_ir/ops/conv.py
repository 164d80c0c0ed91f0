"""Convolutions and pooling over 1, 2 or 3 spatial dims.

One op per kind covers every spatial rank: the rank follows from the weight
(conv) or from the length of ``kernel_size`` (pooling), and the reference picks
torch's function of that rank. Per-dim hyper-parameters are always tuples.

Output sizes use torch's formula ``floor((in + 2p - d(k-1) - 1) / s) + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops._rules import (
    LIBRARY_KERNEL,
    ShapeError,
    check_divisible,
    check_equal,
    check_optional,
    declare,
    device_of,
    floordiv,
    int_arg,
    ntuple,
    optional_inputs,
    same_dtype,
    size_arg,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext

Ints = tuple[int, ...]

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _ints(v: Any, n: int, what: str) -> Ints:
    return tuple(int_arg(x, what) for x in ntuple(v, n, what))


def _spatial(t: TensorType, n: int, what: str) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
    """(leading dims, spatial dims); torch accepts inputs with or without the batch dim."""
    if t.rank not in (n + 1, n + 2):
        raise ShapeError(f"{what}: input of rank {t.rank} for {n} spatial dims")
    return t.shape[: t.rank - n], t.shape[t.rank - n :]


def window_sizes(
    ctx: ShapeContext,
    spatial: Sequence[Dim],
    kernel: Sequence[Dim],
    stride: Ints,
    padding: Ints,
    dilation: Ints,
    ceil_mode: bool,
) -> tuple[Dim, ...]:
    """The output sizes of a window sliding over each spatial dim (conv and pooling)."""
    return tuple(
        window_size(ctx, size, k, s, p, d, ceil_mode)
        for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)
    )


def window_size(ctx: ShapeContext, size: Dim, k: Dim, s: int, p: int, d: int, ceil_mode: bool) -> Dim:
    """Positions of a window sliding over ``size``; ceil mode as torch's
    ``pooling_output_shape``: round up, but never start a window in the right padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = floordiv(span + (s - 1 if ceil_mode else 0), s) + 1
    if ceil_mode:
        last_start = (out - 1) * s
        starts_in_pad = (
            last_start >= size + p
            if isinstance(last_start, int) and isinstance(size, int)
            else ctx.decide(sympy.Ge(last_start, size + p), "ceil_mode window starting in the padding")
        )
        if starts_in_pad:
            out = out - 1
    if isinstance(out, int) and out <= 0:
        raise ShapeError(f"window of size {k} does not fit an input of size {size}")
    return out


# -- convolution ------------------------------------------------------------------------
def _conv_args(b: Emitter, input: Any, weight: Any, bias: Any) -> tuple[list[Any], dict[str, bool], int]:
    """(inputs, the ``has_bias`` attribute, the number of spatial dims)."""
    bias_input, flags = optional_inputs(b, bias=bias)
    n = tensor_of(b.type_of(weight)).rank - 2
    if n not in _CONV:
        raise NotCaptured(f"convolution with a weight of rank {n + 2}")
    return [input, weight, *bias_input], flags, n


class Conv(Op):
    """Convolution (cross-correlation) of ``x`` (N, C, *spatial) with ``w`` (O, C/groups, *kernel).

    ``padding`` is a tuple of ints or ``"same"`` (``"valid"`` is recorded as zeros).
    """

    name = "conv"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return tuple(_CONV.values())

    @staticmethod
    def capture(
        b: Emitter,
        input: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: Any = 1,
    ) -> Any:
        inputs, flags, n = _conv_args(b, input, weight, bias)
        if padding == "valid":
            padding = 0
        pad: Any = padding if padding == "same" else _ints(padding, n, "padding")
        return b.emit(
            "conv",
            inputs,
            stride=_ints(stride, n, "stride"),
            padding=pad,
            dilation=_ints(dilation, n, "dilation"),
            groups=int_arg(groups, "groups"),
            **flags,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        w: Type,
        *bias: Type,
        stride: Ints,
        padding: Ints | str,
        dilation: Ints,
        groups: int,
        has_bias: bool,
    ) -> Type:
        tx, tw = tensor_of(x), tensor_of(w)
        n = tw.rank - 2
        lead, spatial = _spatial(tx, n, "conv")
        if len(stride) != n or len(dilation) != n or (padding != "same" and len(padding) != n) or groups < 1:
            raise ShapeError("conv: hyper-parameters do not match the spatial rank")
        if padding == "same" and any(s != 1 for s in stride):
            raise ShapeError("conv: padding='same' needs stride 1")
        dtype = same_dtype("conv", tx, tw, *(tensor_of(t) for t in bias))
        check_equal(ctx, lead[-1], tw.shape[1] * groups, "conv input channels")
        check_divisible(ctx, tw.shape[0], groups, "conv output channels divisible by groups")
        check_optional(ctx, bias, (has_bias,), (tw.shape[0],), "conv", "bias")
        if isinstance(padding, str):  # "same"
            out = spatial
        else:
            out = window_sizes(ctx, spatial, tw.shape[2:], stride, padding, dilation, False)
        return TensorType(dtype, (*lead[:-1], tw.shape[0], *out), device_of(tx, tw))

    @staticmethod
    def reference(
        x: Any,
        w: Any,
        *bias: Any,
        stride: Ints,
        padding: Ints | str,
        dilation: Ints,
        groups: int,
        has_bias: bool,
    ) -> Any:
        return _CONV[w.dim() - 2](x, w, bias[0] if has_bias else None, stride, padding, dilation, groups)


class ConvTranspose(Op):
    """Transposed convolution; ``w`` is (C, O/groups, *kernel)."""

    name = "conv_transpose"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {
        "tensor_ir": LIBRARY_KERNEL,
        "mlir": "upstream linalg has no transposed convolution; not written as a generic yet",
    }

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return tuple(_CONV_T.values())

    @staticmethod
    def capture(
        b: Emitter,
        input: Any,
        weight: Any,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: Any = 1,
        dilation: Any = 1,
    ) -> Any:
        inputs, flags, n = _conv_args(b, input, weight, bias)
        return b.emit(
            "conv_transpose",
            inputs,
            stride=_ints(stride, n, "stride"),
            padding=_ints(padding, n, "padding"),
            output_padding=_ints(output_padding, n, "output_padding"),
            groups=int_arg(groups, "groups"),
            dilation=_ints(dilation, n, "dilation"),
            **flags,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        w: Type,
        *bias: Type,
        stride: Ints,
        padding: Ints,
        output_padding: Ints,
        groups: int,
        dilation: Ints,
        has_bias: bool,
    ) -> Type:
        tx, tw = tensor_of(x), tensor_of(w)
        n = tw.rank - 2
        lead, spatial = _spatial(tx, n, "conv_transpose")
        if {len(stride), len(padding), len(output_padding), len(dilation)} != {n} or groups < 1:
            raise ShapeError("conv_transpose: hyper-parameters do not match the spatial rank")
        dtype = same_dtype("conv_transpose", tx, tw, *(tensor_of(t) for t in bias))
        check_equal(ctx, lead[-1], tw.shape[0], "conv_transpose input channels")
        check_divisible(ctx, tw.shape[0], groups, "conv_transpose input channels divisible by groups")
        channels = tw.shape[1] * groups
        check_optional(ctx, bias, (has_bias,), (channels,), "conv_transpose", "bias")
        out = tuple(
            (size - 1) * s - 2 * p + d * (k - 1) + op + 1
            for size, k, s, p, op, d in zip(spatial, tw.shape[2:], stride, padding, output_padding, dilation)
        )
        return TensorType(dtype, (*lead[:-1], channels, *out), device_of(tx, tw))

    @staticmethod
    def reference(
        x: Any,
        w: Any,
        *bias: Any,
        stride: Ints,
        padding: Ints,
        output_padding: Ints,
        groups: int,
        dilation: Ints,
        has_bias: bool,
    ) -> Any:
        fn = _CONV_T[w.dim() - 2]
        return fn(x, w, bias[0] if has_bias else None, stride, padding, output_padding, groups, dilation)


# -- pooling ----------------------------------------------------------------------------
def _pool_window(kernel_size: Any, stride: Any, padding: Any, n: int) -> dict[str, Ints]:
    """The ``kernel_size``, ``stride`` and ``padding`` attributes of max and average pooling."""
    k = _ints(kernel_size, n, "kernel_size")
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        s = k  # torch: stride defaults to the kernel size
    else:
        s = _ints(stride, n, "stride")
    return {"kernel_size": k, "stride": s, "padding": _ints(padding, n, "padding")}


def _pool_shape(
    ctx: ShapeContext,
    x: Type,
    kernel_size: Ints,
    stride: Ints,
    padding: Ints,
    dilation: Ints,
    ceil_mode: bool,
    what: str,
) -> TensorType:
    t = tensor_of(x)
    n = len(kernel_size)
    lead, spatial = _spatial(t, n, what)
    if {len(stride), len(padding), len(dilation)} != {n}:
        raise ShapeError(f"{what}: hyper-parameters do not match the spatial rank")
    if any(2 * p > d * (k - 1) + 1 for p, k, d in zip(padding, kernel_size, dilation)):
        raise ShapeError(f"{what}: padding must be at most half the kernel size")
    out = window_sizes(ctx, spatial, kernel_size, stride, padding, dilation, ceil_mode)
    return t.replace(shape=(*lead, *out))


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _max_pool_capture(n: int) -> Any:
    def capture(
        b: Emitter,
        input: Any,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Any:
        if return_indices:
            raise NotCaptured("max pooling with indices")
        return b.emit(
            "max_pool",
            [input],
            **_pool_window(kernel_size, stride, padding, n),
            dilation=_ints(dilation, n, "dilation"),
            ceil_mode=bool(ceil_mode),
        )

    return capture


class MaxPool(Op):
    name = "max_pool"
    traits = frozenset({"pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return tuple((f, _max_pool_capture(n)) for n, f in _MAX_POOL.items())

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *,
        kernel_size: Ints,
        stride: Ints,
        padding: Ints,
        dilation: Ints,
        ceil_mode: bool,
    ) -> Type:
        return _pool_shape(ctx, x, kernel_size, stride, padding, dilation, ceil_mode, "max_pool")

    @staticmethod
    def reference(
        x: Any, *, kernel_size: Ints, stride: Ints, padding: Ints, dilation: Ints, ceil_mode: bool
    ) -> Any:
        return _MAX_POOL[len(kernel_size)](x, kernel_size, stride, padding, dilation, ceil_mode)


def _avg_pool_capture(n: int) -> Any:
    def capture(
        b: Emitter,
        input: Any,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: Any = None,
    ) -> Any:
        window = _pool_window(kernel_size, stride, padding, n)
        if divisor_override is not None:
            divisor_override = int_arg(divisor_override, "divisor_override")
        return b.emit(
            "avg_pool",
            [input],
            **window,
            ceil_mode=bool(ceil_mode),
            count_include_pad=bool(count_include_pad),
            divisor_override=divisor_override,
        )

    return capture


class AvgPool(Op):
    name = "avg_pool"
    traits = frozenset({"pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return tuple((f, _avg_pool_capture(n)) for n, f in _AVG_POOL.items())

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *,
        kernel_size: Ints,
        stride: Ints,
        padding: Ints,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
    ) -> Type:
        ones = (1,) * len(kernel_size)
        return _pool_shape(ctx, x, kernel_size, stride, padding, ones, ceil_mode, "avg_pool")

    @staticmethod
    def reference(
        x: Any,
        *,
        kernel_size: Ints,
        stride: Ints,
        padding: Ints,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
    ) -> Any:
        n = len(kernel_size)
        args = (x, kernel_size, stride, padding, ceil_mode, count_include_pad)
        if n == 1:  # avg_pool1d has no divisor_override
            if divisor_override is not None:
                raise ValueError("avg_pool1d takes no divisor_override")
            return F.avg_pool1d(*args)
        return (F.avg_pool2d if n == 2 else F.avg_pool3d)(*args, divisor_override)


_ADAPTIVE: dict[str, dict[int, Any]] = {
    "avg": {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d},
    "max": {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d},
}


def _adaptive(kind: str) -> type[Op]:
    name = f"adaptive_{kind}_pool"
    fns = _ADAPTIVE[kind]

    def capture_for(n: int) -> Any:
        def capture(b: Emitter, input: Any, output_size: Any, return_indices: bool = False) -> Any:
            if return_indices:
                raise NotCaptured("adaptive pooling with indices")
            t = tensor_of(b.type_of(input))
            if t.rank not in (n + 1, n + 2):
                raise NotCaptured("input rank does not match the pooling rank")
            sizes = ntuple(output_size, n, "output_size")
            # None keeps the input size of that dim
            out = tuple(t.shape[t.rank - n + i] if s is None else size_arg(s) for i, s in enumerate(sizes))
            return b.emit(name, [input], output_size=out)

        return capture

    def infer(ctx: ShapeContext, x: Type, *, output_size: tuple[Dim, ...]) -> Type:
        t = tensor_of(x)
        lead, _ = _spatial(t, len(output_size), name)
        return t.replace(shape=(*lead, *output_size))

    def reference(x: Any, *, output_size: Ints) -> Any:
        return fns[len(output_size)](x, output_size)

    return declare(
        name,
        traits={"pure"},
        torch=lambda: tuple((f, capture_for(n)) for n, f in fns.items()),
        infer=infer,
        reference=reference,
        extern_reasons={
            "tensor_ir": LIBRARY_KERNEL,
            **({"mlir": "only adaptive average pooling to 1x1 (a mean) is emitted"} if kind == "max" else {}),
        },
    )


_adaptive("avg")
_adaptive("max")
