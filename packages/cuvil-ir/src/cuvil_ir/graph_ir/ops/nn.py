"""Neural-network layers that are neither elementwise nor convolutions:
embedding lookup, padding, resampling (interpolate) and scaled dot-product attention."""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops._rules import (
    LIBRARY_KERNEL,
    ShapeError,
    broadcast_shapes,
    check_divisible,
    check_equal,
    device_of,
    ntuple,
    optional_inputs,
    same_dtype,
    size_arg,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext, as_dim


def _is_number(v: Any) -> bool:
    """A Python int or float (not a bool, nor a size expression)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Embedding(Op):
    """Rows of ``weight`` (V, D) picked by integer ``indices``; inputs in torch's order."""

    name = "embedding"
    traits = frozenset({"pure"})
    extern_reasons = {"tensor_ir": "a gather at data-dependent rows; kernels index buffers by sizes only"}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.embedding,)

    @staticmethod
    def capture(
        b: Emitter,
        input: Any,
        weight: Any,
        padding_idx: Any = None,
        max_norm: Any = None,
        norm_type: Any = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Any:
        # padding_idx only changes gradients; max_norm rewrites the weight in place
        if max_norm is not None:
            raise NotCaptured("embedding with max_norm renormalises the weight in place")
        return b.emit("embedding", [input, weight])

    @staticmethod
    def infer(ctx: ShapeContext, indices: Type, weight: Type) -> Type:
        ti, tw = tensor_of(indices), tensor_of(weight)
        if ti.dtype not in (DType.i32, DType.i64) or tw.rank != 2:
            raise ShapeError(f"embedding of {ti.dtype.value} indices into a rank-{tw.rank} weight")
        return TensorType(tw.dtype, (*ti.shape, tw.shape[1]), device_of(ti, tw))

    @staticmethod
    def reference(indices: Any, weight: Any) -> Any:
        return F.embedding(indices, weight)


class Pad(Op):
    """``F.pad``: ``pad`` lists (before, after) amounts from the last dim backwards;
    negative amounts crop."""

    name = "pad"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.pad,)

    @staticmethod
    def capture(b: Emitter, input: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
        t = tensor_of(b.type_of(input))
        amounts = tuple(size_arg(p) for p in pad)
        n = len(amounts) // 2
        if len(amounts) % 2 or n > t.rank:
            raise NotCaptured("pad needs (before, after) pairs for at most every dim")
        if mode != "constant":
            # torch pads 1-3 trailing dims of a batched or unbatched input in these modes
            if (
                mode not in ("reflect", "replicate", "circular")
                or not 1 <= n <= 3
                or t.rank not in (n + 1, n + 2)
            ):
                raise NotCaptured(f"pad mode {mode!r} with {n} padded dims of a rank-{t.rank} input")
            if value not in (None, 0):
                raise NotCaptured("only constant padding takes a value")
            value = None
        elif value is not None and not _is_number(value):
            raise NotCaptured("pad value must be a Python number")
        return b.emit("pad", [input], pad=amounts, mode=mode, value=value)

    @staticmethod
    def infer(
        ctx: ShapeContext, x: Type, *, pad: tuple[Dim, ...], mode: str, value: int | float | None
    ) -> Type:
        t = tensor_of(x)
        if len(pad) % 2 or len(pad) // 2 > t.rank:
            raise ShapeError(f"pad of length {len(pad)} for rank {t.rank}")
        shape = list(t.shape)
        for i in range(len(pad) // 2):
            shape[t.rank - 1 - i] = as_dim(sympy.sympify(shape[t.rank - 1 - i] + pad[2 * i] + pad[2 * i + 1]))
        return t.replace(shape=tuple(shape))

    @staticmethod
    def reference(x: Any, *, pad: tuple[int, ...], mode: str, value: Any) -> Any:
        return F.pad(x, pad, mode, value)


_LINEAR_MODES = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _scaled(size: Dim, scale: float) -> Dim:
    """torch's ``floor(size * scale)``, computed in double precision.

    A symbolic size is scaled by the decimal value of ``scale`` (0.6 as 3/5): double
    rounding makes ``5 * 0.6`` exactly 3, which the binary value of 0.6 would miss.
    """
    if isinstance(size, int):
        return math.floor(size * scale)
    return as_dim(sympy.floor(sympy.sympify(size) * sympy.Rational(repr(scale))))


class Interpolate(Op):
    """Resampling of the spatial dims of (N, C, *spatial) to ``size``, or by ``scale_factor``.

    The two are kept apart (not turned into one another) because torch maps
    coordinates with the given scale factor, not with the ratio of sizes.
    """

    name = "interpolate"
    traits = frozenset({"pure"})
    extern_reasons = {"mlir": "resampling is not written in linalg yet"}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.interpolate, F.upsample)

    @staticmethod
    def capture(
        b: Emitter,
        input: Any,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        align_corners: Any = None,
        recompute_scale_factor: Any = None,
        antialias: bool = False,
    ) -> Any:
        t = tensor_of(b.type_of(input))
        n = t.rank - 2
        if not 1 <= n <= 3 or (size is None) == (scale_factor is None):
            raise NotCaptured("interpolate needs a 3-5-D input and exactly one of size, scale_factor")
        linear = mode in _LINEAR_MODES
        if (linear and _LINEAR_MODES[mode] != n) or (
            not linear and mode not in ("nearest", "nearest-exact", "area")
        ):
            raise NotCaptured(f"mode {mode!r} for {n} spatial dims")
        if (align_corners is not None and not linear) or (recompute_scale_factor and size is not None):
            raise NotCaptured("arguments torch rejects for this mode")
        if antialias and not (mode in ("bilinear", "bicubic") and n == 2):
            raise NotCaptured("antialias is only for bilinear/bicubic")
        if linear and align_corners is None:
            align_corners = False  # torch's default (with a warning)
        sizes = None if size is None else tuple(size_arg(s) for s in ntuple(size, n, "size"))
        scales = None
        if scale_factor is not None:
            scales = ntuple(scale_factor, n, "scale_factor")
            if not all(_is_number(s) for s in scales):
                raise NotCaptured("scale_factor must be Python numbers")
            scales = tuple(float(s) for s in scales)
        return b.emit(
            "interpolate",
            [input],
            size=sizes,
            scale_factor=scales,
            mode=mode,
            align_corners=align_corners,
            recompute_scale_factor=recompute_scale_factor,
            antialias=bool(antialias),
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        x: Type,
        *,
        size: tuple[Dim, ...] | None,
        scale_factor: tuple[float, ...] | None,
        mode: str,
        align_corners: bool | None,
        recompute_scale_factor: bool | None,
        antialias: bool,
    ) -> Type:
        t = tensor_of(x)
        n = t.rank - 2
        if (size is None) == (scale_factor is None) or len(size or scale_factor or ()) != n:
            raise ShapeError("interpolate: one size or scale factor per spatial dim")
        if size is not None:
            out = size
        else:
            out = tuple(_scaled(d, s) for d, s in zip(t.shape[2:], scale_factor or ()))
        return t.replace(shape=(*t.shape[:2], *out))

    @staticmethod
    def reference(
        x: Any,
        *,
        size: Any,
        scale_factor: Any,
        mode: str,
        align_corners: Any,
        recompute_scale_factor: Any,
        antialias: bool,
    ) -> Any:
        return F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)


class ScaledDotProductAttention(Op):
    """softmax(q kᵀ · scale + mask) v over (..., L, E), (..., S, E), (..., S, Ev); inference only.

    The batch dims of q, k and v broadcast as torch's do (with ``enable_gqa``, those
    before the heads dim -3, whose q count is a multiple of k's and v's). A primitive:
    the targets compiling through Tensor IR run it as one library call (cpu: its own
    flash kernel); a consumer without it (MLIR, ONNX) writes its fallback
    decomposition, :func:`cuvil_ir.graph_ir.fallbacks.sdpa`.
    """

    name = "sdpa"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL}

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.scaled_dot_product_attention,)

    @staticmethod
    def capture(
        b: Emitter,
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: Any = 0.0,
        is_causal: bool = False,
        scale: Any = None,
        enable_gqa: bool = False,
    ) -> Any:
        if dropout_p != 0.0:
            raise NotCaptured("attention dropout")
        if attn_mask is not None and is_causal:
            raise NotCaptured("both a mask and is_causal")
        mask, flags = optional_inputs(b, mask=attn_mask)
        if scale is not None and not _is_number(scale):
            raise NotCaptured("scale must be a Python number")
        return b.emit(
            "sdpa",
            [query, key, value, *mask],
            is_causal=bool(is_causal),
            scale=None if scale is None else float(scale),
            enable_gqa=bool(enable_gqa),
            **flags,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        q: Type,
        k: Type,
        v: Type,
        *mask: Type,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        has_mask: bool,
    ) -> Type:
        tq, tk, tv = tensor_of(q), tensor_of(k), tensor_of(v)
        if len(mask) != int(has_mask) or min(tq.rank, tk.rank, tv.rank) < 2:
            raise ShapeError("sdpa: operands of rank < 2, or mask inputs do not match has_mask")
        dtype = same_dtype("sdpa", tq, tk, tv)
        if not dtype.is_floating:
            raise ShapeError(f"sdpa of {dtype.value} tensors")
        check_equal(ctx, tq.shape[-1], tk.shape[-1], "sdpa query/key embedding size")
        check_equal(ctx, tk.shape[-2], tv.shape[-2], "sdpa key/value sequence length")
        if enable_gqa:
            # k and v heads are repeated to q's (repeat_interleave over dim -3), as torch does
            if min(tq.rank, tk.rank, tv.rank) < 3:
                raise ShapeError("sdpa with enable_gqa needs a heads dim (-3) on q, k and v")
            check_divisible(ctx, tq.shape[-3], tk.shape[-3], "sdpa query heads divisible by key heads")
            check_divisible(ctx, tq.shape[-3], tv.shape[-3], "sdpa query heads divisible by value heads")
            batch = (*broadcast_shapes(ctx, tq.shape[:-3], tk.shape[:-3], tv.shape[:-3]), tq.shape[-3])
        else:
            batch = broadcast_shapes(ctx, tq.shape[:-2], tk.shape[:-2], tv.shape[:-2])
        if mask:
            tm = tensor_of(mask[0])
            if tm.dtype != DType.bool and tm.dtype != dtype:
                raise ShapeError(f"sdpa mask of dtype {tm.dtype.value}")
            broadcast_shapes(ctx, tm.shape, (*batch, tq.shape[-2], tk.shape[-2]))
        return TensorType(dtype, (*batch, tq.shape[-2], tv.shape[-1]), device_of(tq, tk, tv))

    @staticmethod
    def reference(
        q: Any,
        k: Any,
        v: Any,
        *mask: Any,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        has_mask: bool,
    ) -> Any:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask[0] if has_mask else None,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
