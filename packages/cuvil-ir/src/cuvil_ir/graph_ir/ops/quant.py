"""Linear layers with low-precision weights: ``weight_only_linear``.

``y = x @ dequantize(weight)^T + bias``, activations and accumulation in the activation's
dtype (float32 in practice), the weight stored in one of :data:`FORMATS` (docs/quantization.md):

- ``"bf16"``: ``weight`` bfloat16 ``[N, K]``; no scales.
- ``"int8"``: ``weight`` int8 ``[N, K]``, ``scales`` float32 ``[N]``: ``W = q * scale[n]``
  (symmetric per output channel, torchao's ``Int8WeightOnlyConfig``).
- ``"int4"``: ``weight`` uint8 ``[N, K // 2]`` (two values a byte), ``scales`` and ``zeros``
  float32 ``[N, K // group_size]``: ``W = (q - 8) * scale[n, g] + zero[n, g]``, ``q`` in 0..15
  (asymmetric per group, torchao's ``Int4WeightOnlyConfig`` math, whose zero point is a float).
  [Note: int4 packing] Within each run of 32 values of a row, byte ``i`` holds value ``i`` in its
  low nibble and value ``i + 16`` in its high nibble: a kernel that loads ``VW <= 16`` bytes
  unpacks them into two vectors of consecutive values, with no shuffle, whatever its vector width.
- ``"int4-a8"``: ``"int4"``'s weights, with the activations rounded to int8 at run time per block
  of 32 values along ``K`` (:func:`round_activations`: ``d = max|x| / 127``, ``q = round(x / d)``,
  llama.cpp's Q8_0), so a kernel multiplies integers (``vpmaddubsw``, VNNI's ``vpdpbusd``): the
  product is ``round_activations(x) @ dequantize(weight)^T``, exactly what the reference computes.

The torch callable :func:`weight_only_linear` is what a quantized module's ``forward`` calls
(``cuvil.quantize``): in eager it runs :func:`reference` (dequantize in float32, then
``F.linear``); captured, it is one ``weight_only_linear`` node, which the ``cpu`` target runs with
its own kernel (``cuvil_backend_cpu/quant_linear.c``) and every other consumer through the
reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function

from cuvil_ir.graph_ir.ops._rules import ShapeError, check_divisible, check_equal, device_of, tensor_of
from cuvil_ir.graph_ir.registry import Emitter, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

#: the weight formats, and what each stores
FORMATS = ("bf16", "int8", "int4", "int4-a8")
#: the formats that store int4 codes (``"int4-a8"`` differs in what happens to the activations)
INT4_FORMATS = ("int4", "int4-a8")
#: values of a row of activations that share one int8 scale in ``"int4-a8"``
ACTIVATION_BLOCK = 32
#: float32's smallest normal: a block scale below it rounds its block to 0 (1 / scale could overflow)
_SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
#: int4 group sizes (values of a row sharing one scale and zero); torchao's choices
GROUP_SIZES = (32, 64, 128, 256)
#: the values a 4-bit code stands for are ``(q - INT4_MID) * scale + zero``
INT4_MID = 8

_WEIGHT_DTYPES = {"bf16": DType.bf16, "int8": DType.i8, "int4": DType.u8, "int4-a8": DType.u8}
#: the quantization parameters each format takes, in operand order
_PARAMS = {"bf16": (), "int8": ("scales",), "int4": ("scales", "zeros"), "int4-a8": ("scales", "zeros")}


class QuantFormatError(ValueError):
    """A weight, its parameters or its format that do not fit together; the message
    says which and how to fix it."""


def check_format(fmt: str, group_size: int) -> None:
    if fmt not in FORMATS:
        raise QuantFormatError(
            f"weight_only_linear: unknown format {fmt!r}; use one of {', '.join(map(repr, FORMATS))}"
        )
    if fmt in INT4_FORMATS and group_size not in GROUP_SIZES:
        raise QuantFormatError(
            f"weight_only_linear: {fmt} group size {group_size} is not one of "
            f"{', '.join(map(str, GROUP_SIZES))}; quantize again with one of those"
        )
    if fmt not in INT4_FORMATS and group_size != 0:
        raise QuantFormatError(
            f"weight_only_linear: {fmt} weights take no group size (got {group_size}); "
            "int8 has one scale per output channel, bf16 none"
        )


def in_features(weight: Any, fmt: str) -> Any:
    """K, the inner size, of a stored weight (two int4 values a byte)."""
    return weight.shape[1] * 2 if fmt in INT4_FORMATS else weight.shape[1]


def check_operands(
    weight: torch.Tensor,
    scales: torch.Tensor | None,
    zeros: torch.Tensor | None,
    *,
    fmt: str,
    group_size: int,
) -> None:
    """Raise :class:`QuantFormatError` unless the tensors are a weight of ``fmt``."""
    check_format(fmt, group_size)
    want = _WEIGHT_DTYPES[fmt].torch
    if weight.dim() != 2 or weight.dtype != want:
        raise QuantFormatError(
            f"weight_only_linear: {fmt} weights are 2-d {want} tensors, got {weight.dtype} of shape "
            f"{tuple(weight.shape)}; make them with cuvil.quantize"
        )
    given = {"scales": scales, "zeros": zeros}
    n, k = weight.shape[0], in_features(weight, fmt)
    if fmt in INT4_FORMATS and k % group_size:
        raise QuantFormatError(
            f"weight_only_linear: {fmt} weight of {k} values a row is not a whole number of groups of "
            f"{group_size}; pick a group size that divides {k}"
        )
    shape = (n,) if fmt == "int8" else (n, k // group_size if group_size else 0)
    for name in ("scales", "zeros"):
        t = given[name]
        if name not in _PARAMS[fmt]:
            if t is not None:
                raise QuantFormatError(f"weight_only_linear: {fmt} weights take no {name}")
            continue
        if t is None or t.dtype != torch.float32 or tuple(t.shape) != shape:
            got = "none" if t is None else f"{t.dtype} of shape {tuple(t.shape)}"
            raise QuantFormatError(
                f"weight_only_linear: {fmt} {name} must be float32 of shape {shape} for a weight of "
                f"{n} x {k}, got {got}"
            )


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 ``[N, K]`` (K a multiple of 32) as bytes ``[N, K // 2]`` ([Note: int4 packing])."""
    n, k = q.shape
    if k % 32:
        raise QuantFormatError(f"pack_int4: {k} values a row is not a multiple of 32")
    runs = q.to(torch.uint8).reshape(n, k // 32, 2, 16)
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The codes 0..15 ``[N, K]`` of bytes ``[N, K // 2]`` (the inverse of :func:`pack_int4`)."""
    n, half = packed.shape
    runs = packed.reshape(n, half // 16, 1, 16)
    return torch.cat([runs & 15, runs >> 4], dim=2).reshape(n, half * 2)


def dequantize(
    weight: torch.Tensor,
    scales: torch.Tensor | None = None,
    zeros: torch.Tensor | None = None,
    *,
    fmt: str,
    group_size: int = 0,
) -> torch.Tensor:
    """The weight in float32 ``[N, K]``, as the formats define it (see the module doc)."""
    if fmt == "bf16":
        return weight.float()
    if fmt == "int8":
        assert scales is not None
        return weight.float() * scales[:, None]
    assert scales is not None and zeros is not None
    q = unpack_int4(weight).float()
    n, k = q.shape
    grouped = (q.reshape(n, k // group_size, group_size) - INT4_MID) * scales[..., None] + zeros[..., None]
    return grouped.reshape(n, k)


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``[..., K]``, ``K`` a multiple of :data:`ACTIVATION_BLOCK`) as ``"int4-a8"`` rounds
    it, in ``x``'s dtype: per block of 32 values of the last dimension, in float32,
    ``d = max|x| / 127``, ``q = clamp(round(x * (1 / d)), -127, 127)`` (round half to even; 0 where
    ``d`` is 0 or subnormal, whose reciprocal could overflow), the value ``q * d``; a block
    holding a NaN or an infinity is all NaN. The
    ``cpu`` kernel (quant_linear.c's ``round_block``) computes the same codes, operation for
    operation."""
    k = x.shape[-1]
    if k % ACTIVATION_BLOCK:
        raise QuantFormatError(
            f"int4-a8: {k} activation values a row is not a multiple of {ACTIVATION_BLOCK}"
        )
    b = x.float().reshape(*x.shape[:-1], k // ACTIVATION_BLOCK, ACTIVATION_BLOCK)
    amax = b.abs().amax(-1, keepdim=True)
    d = amax / 127
    inv = torch.where(d >= _SMALLEST_NORMAL, 1.0 / d, torch.zeros_like(d))
    q = torch.round(b * inv).clamp(-127, 127)
    out = torch.where(torch.isfinite(amax), q * d, torch.full_like(d, float("nan")))
    return out.reshape(x.shape).to(x.dtype)


def reference(x: Any, weight: Any, *rest: Any, fmt: str, group_size: int, has_bias: bool) -> Any:
    """Dequantize in float32, then ``F.linear`` in the activation's dtype (``"int4-a8"``: of
    the activations :func:`round_activations` rounds)."""
    params = rest[: len(_PARAMS[fmt])]
    if fmt == "int4-a8":
        x = round_activations(x)
    w = dequantize(weight, *params, fmt=fmt, group_size=group_size)
    return F.linear(x, w.to(x.dtype), rest[-1] if has_bias else None)


def weight_only_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor | None = None,
    zeros: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    fmt: str,
    group_size: int = 0,
) -> torch.Tensor:
    """``x @ dequantize(weight)^T + bias`` for a weight of format ``fmt`` (see the module doc).

    A torch function (``__torch_function__`` modes see it), so ``cu.compile`` captures it
    as one ``weight_only_linear`` node."""
    tensors = tuple(t for t in (x, weight, scales, zeros, bias) if t is not None)
    if has_torch_function(tensors):
        return handle_torch_function(  # type: ignore[no-any-return]
            weight_only_linear, tensors, x, weight, scales, zeros, bias, fmt=fmt, group_size=group_size
        )
    check_operands(weight, scales, zeros, fmt=fmt, group_size=group_size)
    params = (scales, zeros)[: len(_PARAMS[fmt])]
    extra = () if bias is None else (bias,)
    return reference(x, weight, *params, *extra, fmt=fmt, group_size=group_size, has_bias=bias is not None)


class WeightOnlyLinear(Op):
    """``x @ dequantize(weight)^T [+ bias]``; inputs ``x, weight``, then the format's
    parameters (``scales`` for int8; ``scales, zeros`` for int4), then ``bias`` if ``has_bias``."""

    name = "weight_only_linear"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {
        "tensor_ir": "a matrix product that dequantizes packed weights in registers: one kernel call "
        "(the cpu target's own, cuvil_backend_cpu/quant_linear.c), not a loop nest",
        "mlir": "packed low-precision weights have no linalg form here yet (the reference dequantizes, "
        "then multiplies)",
        "onnx": "not exported yet (ONNX's blocked DequantizeLinear of opset 21 followed by MatMul, or "
        "com.microsoft's MatMulNBits, would carry it)",
    }

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (weight_only_linear,)

    @staticmethod
    def capture(
        b: Emitter,
        x: Any,
        weight: Any,
        scales: Any = None,
        zeros: Any = None,
        bias: Any = None,
        *,
        fmt: str,
        group_size: int = 0,
    ) -> Any:
        check_format(fmt, group_size)
        given = {"scales": scales, "zeros": zeros}
        for name, t in given.items():
            if (t is not None) != (name in _PARAMS[fmt]):
                raise QuantFormatError(
                    f"weight_only_linear: {fmt} weights {'need' if t is None else 'take no'} {name}"
                )
        params = [given[p] for p in _PARAMS[fmt]]
        extra = [] if bias is None else [bias]
        return b.emit(
            "weight_only_linear",
            [x, weight, *params, *extra],
            fmt=fmt,
            group_size=group_size,
            has_bias=bias is not None,
        )

    @staticmethod
    def infer(
        ctx: ShapeContext, x: Type, weight: Type, *rest: Type, fmt: str, group_size: int, has_bias: bool
    ) -> Type:
        try:
            check_format(fmt, group_size)
        except QuantFormatError as e:
            raise ShapeError(str(e)) from None
        tx, tw = tensor_of(x), tensor_of(weight)
        names = (*_PARAMS[fmt], *(("bias",) if has_bias else ()))
        if len(rest) != len(names):
            raise ShapeError(
                f"weight_only_linear: {fmt} takes {', '.join(names) or 'no'} operands after the weight"
            )
        if not tx.dtype.is_floating or tx.rank == 0:
            raise ShapeError(f"weight_only_linear: activations must be a float tensor, got {tx}")
        if tw.dtype != _WEIGHT_DTYPES[fmt] or tw.rank != 2:
            raise ShapeError(
                f"weight_only_linear: {fmt} weights are 2-d {_WEIGHT_DTYPES[fmt].value} tensors, got {tw}"
            )
        n, k = tw.shape[0], in_features(tw, fmt)
        check_equal(ctx, tx.shape[-1], k, "weight_only_linear in_features")
        if fmt in INT4_FORMATS:
            check_divisible(ctx, k, group_size, f"weight_only_linear: {fmt} values a row, by the group size")
        shapes = {"scales": (n,) if fmt == "int8" else (n, k // group_size if group_size else 0)}
        shapes["zeros"] = shapes["scales"]
        shapes["bias"] = (n,)
        for name, t in zip(names, rest):
            tt = tensor_of(t, name)
            want = tx.dtype if name == "bias" else DType.f32
            if tt.dtype != want or tt.rank != len(shapes[name]):
                raise ShapeError(
                    f"weight_only_linear: {name} of {tt}, expected {want.value} of rank {len(shapes[name])}"
                )
            for a, e in zip(tt.shape, shapes[name]):
                check_equal(ctx, a, e, f"weight_only_linear {name} size")
        return TensorType(tx.dtype, (*tx.shape[:-1], n), device_of(tx, tw))

    @staticmethod
    def reference(x: Any, weight: Any, *rest: Any, fmt: str, group_size: int, has_bias: bool) -> Any:
        return reference(x, weight, *rest, fmt=fmt, group_size=group_size, has_bias=has_bias)


__all__ = [
    "ACTIVATION_BLOCK",
    "FORMATS",
    "GROUP_SIZES",
    "INT4_FORMATS",
    "INT4_MID",
    "QuantFormatError",
    "WeightOnlyLinear",
    "check_format",
    "check_operands",
    "dequantize",
    "in_features",
    "pack_int4",
    "round_activations",
    "unpack_int4",
    "weight_only_linear",
]
