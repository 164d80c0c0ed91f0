"""``cu.quantize``: linear layers with bf16, int8 or int4 weights (docs/quantization.md).

``cu.quantize(model, "int8")`` replaces, in place, every ``nn.Linear`` of ``model`` by a
:class:`QuantizedLinear` holding its weight in that format; the module's ``forward`` calls
``weight_only_linear`` (``cuvil_ir/graph_ir/ops/quant.py``), which eager runs as its reference
(dequantize in float32, then ``F.linear``) and ``cu.compile`` captures as one node that the
``cpu`` target runs with its own kernel. The quantization math is torchao's weight-only configs':

- ``"int8"`` (``Int8WeightOnlyConfig``): symmetric per output channel,
  ``scale = max(|w|) / 127.5`` (at least float32's epsilon), ``q = clamp(round(w / scale), -128, 127)``;
- ``"int4"`` (``Int4WeightOnlyConfig``, tinygemm's parameters): asymmetric per group of
  ``group_size`` values of a row, ``scale = (max - min) / 15`` (at least 1e-6),
  ``zero = min + 8 scale``, ``q = clamp(round((w - min) / scale), 0, 15)``, ``w ~ (q - 8) scale + zero``;
- ``"bf16"``: the weight rounded to bfloat16 (to nearest even);
- ``"int4-a8"``: ``"int4"``'s weights, and the activations rounded to int8 at run time per block
  of 32 values (``d = max|x| / 127``, llama.cpp's Q8_0), so the ``cpu`` kernel multiplies
  integers: faster than ``"int4"`` where the dequantizing arithmetic, not memory, limits the
  product (a decode step on one AVX2 core), at the cost of the activations' rounding error.

Layers a torchao config already quantized (their weight a torchao tensor subclass) are converted
with torchao's own codes, scales and zero points, whatever ``fmt`` says (see :func:`from_torchao`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cuvil_ir.graph_ir.ops.quant import (
    FORMATS,
    GROUP_SIZES,
    INT4_FORMATS,
    INT4_MID,
    QuantFormatError,
    check_format,
    check_operands,
    dequantize,
    pack_int4,
    unpack_int4,
    weight_only_linear,
)

#: torchao's smallest scales (``eps`` of its int8 and int4 weight-only configs)
INT8_EPS = torch.finfo(torch.float32).eps
INT4_EPS = 1e-6


class QuantizedLinear(nn.Module):
    """``nn.Linear`` with its weight in a low-precision format: buffers ``weight`` (packed),
    ``scales`` and ``zeros`` (the format's parameters, or ``None``) and the float ``bias``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        fmt: str,
        *,
        group_size: int = 0,
        bias: bool = True,
        weight: torch.Tensor | None = None,
        scales: torch.Tensor | None = None,
        zeros: torch.Tensor | None = None,
        bias_value: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        check_format(fmt, group_size)
        if fmt in INT4_FORMATS and in_features % group_size:
            fits = [str(g) for g in GROUP_SIZES if in_features % g == 0]
            fix = f"use group_size={' or '.join(fits)}" if fits else "no int4 group size divides it: use int8"
            raise QuantFormatError(
                f"int4: in_features {in_features} is not a whole number of groups of {group_size}; {fix}, "
                "or leave this layer out with filter="
            )
        self.in_features, self.out_features = in_features, out_features
        self.fmt, self.group_size = fmt, group_size
        n, k = out_features, in_features
        if weight is None:
            dtype = {"bf16": torch.bfloat16, "int8": torch.int8}.get(fmt, torch.uint8)
            weight = torch.zeros((n, k // 2 if fmt in INT4_FORMATS else k), dtype=dtype)
            if fmt == "int8":
                scales = torch.ones(n)
            elif fmt in INT4_FORMATS:
                scales, zeros = torch.ones(n, k // group_size), torch.zeros(n, k // group_size)
        check_operands(weight, scales, zeros, fmt=fmt, group_size=group_size)
        if weight.shape[0] != n or (weight.shape[1] * (2 if fmt in INT4_FORMATS else 1)) != k:
            raise QuantFormatError(
                f"QuantizedLinear: {fmt} weight of shape {tuple(weight.shape)} for {k} -> {n}"
            )
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("scales", None if scales is None else scales.contiguous())
        self.register_buffer("zeros", None if zeros is None else zeros.contiguous())
        if bias_value is not None:
            self.bias: nn.Parameter | None = nn.Parameter(bias_value.detach().clone(), requires_grad=False)
        elif bias:
            self.bias = nn.Parameter(torch.zeros(n), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, group_size: int = 128) -> QuantizedLinear:
        """``linear``'s weight quantized to ``fmt`` (``group_size`` is int4's; the others take none)."""
        group = group_size if fmt in INT4_FORMATS else 0
        check_format(fmt, group)
        w = linear.weight.detach()
        if w.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise QuantFormatError(f"cu.quantize: a linear with {w.dtype} weights; quantize float weights")
        n, k = w.shape
        if fmt in INT4_FORMATS and k % group:
            cls(k, n, fmt, group_size=group)  # raises the error naming the group sizes that fit
        weight, scales, zeros = quantize_weight(w, fmt, group)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        return cls(
            k,
            n,
            fmt,
            group_size=group,
            bias=bias is not None,
            weight=weight,
            scales=scales,
            zeros=zeros,
            bias_value=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weight_only_linear(
            x, self.weight, self.scales, self.zeros, self.bias, fmt=self.fmt, group_size=self.group_size
        )

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight ``[out_features, in_features]`` this layer multiplies by."""
        params = [t for t in (self.scales, self.zeros) if t is not None]
        return dequantize(self.weight, *params, fmt=self.fmt, group_size=self.group_size)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.fmt in INT4_FORMATS else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt!r}{group}, "
            f"bias={self.bias is not None}"
        )


def quantize_weight(
    w: torch.Tensor, fmt: str, group_size: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(weight, scales, zeros)`` of the float weight ``w`` ``[N, K]`` in ``fmt`` (the module
    doc's math, computed in float32)."""
    w = w.detach().float()
    if fmt == "bf16":
        return w.to(torch.bfloat16), None, None
    if fmt == "int8":
        amax = torch.maximum(-w.amin(1).clamp(max=0), w.amax(1).clamp(min=0))
        scale = (amax / 127.5).clamp(min=INT8_EPS)
        q = torch.clamp(torch.round(w * (1.0 / scale[:, None])), -128, 127)
        return q.to(torch.int8), scale, None
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=INT4_EPS)
    zero = lo + scale * INT4_MID
    low = zero - scale * INT4_MID
    q = torch.clamp(torch.round((g - low[..., None]) / scale[..., None]), 0, 15)
    return pack_int4(q.reshape(n, k)), scale, zero


# -- torchao's quantized weights ---------------------------------------------------------------


def is_torchao_weight(t: Any) -> bool:
    """Whether ``t`` is one of torchao's quantized weight tensors (checked by class, without
    importing torchao)."""
    return isinstance(t, torch.Tensor) and type(t).__module__.startswith("torchao.")


def from_torchao(linear: nn.Linear) -> QuantizedLinear:
    """The :class:`QuantizedLinear` of a linear torchao quantized, with torchao's codes.

    Recognized: ``Int8Tensor`` (``Int8WeightOnlyConfig``: per-row int8, one scale per output
    channel, zero point 0) and ``Int4OpaqueTensor`` (``PrototypeInt4WeightOnlyConfig``, torchao's
    CPU int4 weight-only path: ``_weight_int4pack_mm_for_cpu``'s packing, tinygemm's scales and
    zero points). Anything else is a :class:`QuantFormatError` naming it. The conversion is checked
    on one random input against torchao's own forward, so a layout torchao changed is an error,
    never a silently wrong layer."""
    w = linear.weight
    kind = type(w).__name__
    n, k = w.shape
    bias = linear.bias.detach().float() if linear.bias is not None else None
    if kind == "Int8Tensor":
        block = list(getattr(w, "block_size", []))
        if block != [1, k] or getattr(w, "act_quant_kwargs", None) is not None:
            raise QuantFormatError(
                f"cu.quantize: a torchao Int8Tensor with block size {block} (activations quantized: "
                f"{getattr(w, 'act_quant_kwargs', None) is not None}); Cuvil's int8 is weight-only, one "
                "scale per output channel: use Int8WeightOnlyConfig() with its default granularity"
            )
        zp = getattr(w, "zero_point", None)
        if zp is not None and bool((zp != 0).any()):
            raise QuantFormatError(
                "cu.quantize: a torchao Int8Tensor with nonzero zero points (not symmetric)"
            )
        q = w.qdata.detach().to(torch.int8).reshape(n, k)
        scale = w.scale.detach().float().reshape(n)
        out = QuantizedLinear(k, n, "int8", bias=bias is not None, weight=q, scales=scale, bias_value=bias)
    elif kind == "Int4OpaqueTensor":
        group = int(list(w.block_size)[-1])
        if group not in GROUP_SIZES or n % 64:
            raise QuantFormatError(
                f"cu.quantize: a torchao Int4OpaqueTensor of {n} x {k}, group {group}: only groups of "
                f"{', '.join(map(str, GROUP_SIZES))} and out_features a multiple of 64 (its packing's blocks) "
                "are converted"
            )
        q = _unpack_int4_cpu(w.qdata.detach(), n, k)
        sz = w.scale_and_zero.detach().float()  # [K / group, N, 2]: tinygemm's scale and zero
        scale, zero = sz[..., 0].t().contiguous(), sz[..., 1].t().contiguous()
        out = QuantizedLinear(
            k,
            n,
            "int4",
            group_size=group,
            bias=bias is not None,
            weight=pack_int4(q),
            scales=scale,
            zeros=zero,
            bias_value=bias,
        )
    else:
        raise QuantFormatError(
            f"cu.quantize: torchao's {type(w).__module__}.{kind} weights are not converted; Cuvil reads "
            "Int8Tensor (Int8WeightOnlyConfig) and Int4OpaqueTensor (PrototypeInt4WeightOnlyConfig, "
            "torchao's CPU int4 path). Quantize the float model with cu.quantize(model, 'int4') instead"
        )
    _check_against(linear, out)
    return out


def _unpack_int4_cpu(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Codes ``[N, K]`` of ``_convert_weight_to_int4pack_for_cpu``'s bytes: blocks of ``B``
    output rows, stored ``[N / B][K][B / 2]``, byte ``i`` of row ``k`` of block ``b`` holding
    output row ``B b + i`` in its low nibble and ``B b + B / 2 + i`` in its high nibble, where
    ``B`` is the running torch's block (:func:`_int4_cpu_block`: 64 where its kernel was built
    for AVX-512, 32 for AVX2; verified after conversion by :func:`_check_against`)."""
    block = _int4_cpu_block()
    p = packed.reshape(n // block, k, block // 2)
    q = torch.cat([p & 15, p >> 4], dim=2)  # [N / B, K, B]
    return q.permute(0, 2, 1).reshape(n, k)


@functools.cache
def _int4_cpu_block() -> int:
    """The output rows of one block of torch's CPU int4 packing on this host, read off the packing
    itself: torch picks it by the CPU's ISA (one wheel, two layouts), so a weight torchao packed on
    another ISA would not be read right (the conversion's check says so)."""
    probe = torch.zeros(64, 64, dtype=torch.int32)
    probe[32, 0] = 5
    q = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1).flatten()
    if int(q[0]) == 0x50:  # row 32 in the high nibble of block 0's first byte
        return 64
    if int(q[64 * 16]) == 0x05:  # row 32 first in block 1 (64 rows of K, 16 bytes each)
        return 32
    raise QuantFormatError(
        "cu.quantize: this torch's CPU int4 packing (_convert_weight_to_int4pack_for_cpu) has a layout "
        "Cuvil does not know; quantize the float model with cu.quantize(model, 'int4') instead"
    )


def _check_against(original: nn.Module, converted: QuantizedLinear) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, converted.in_features, generator=gen)
    with torch.no_grad():
        want = original(x).float()
        got = converted(x)
    scale = float(want.abs().max()) + 1e-6
    err = float((got - want).abs().max())
    # torchao's own kernels may run in bf16 or with their own rounding: agreement to 2% of the
    # largest output tells a right layout from a wrong one (a wrong one is off by ~100%)
    if not err <= 0.02 * scale:
        raise QuantFormatError(
            f"cu.quantize: converting torchao's {type(original.weight).__name__} gave outputs {err:.3g} "
            f"away from torchao's own (largest {scale:.3g}): this torchao version lays its weights out "
            "differently; quantize the float model with cu.quantize(model, fmt) instead"
        )


# -- the entry point -------------------------------------------------------------------------------


def quantize(
    model: nn.Module,
    fmt: str | None = None,
    *,
    group_size: int = 128,
    filter: Callable[[str, nn.Module], bool] | None = None,
) -> nn.Module:
    """Replace ``model``'s linear layers, in place, by :class:`QuantizedLinear` layers of
    ``fmt`` (``"bf16"``, ``"int8"``, ``"int4"`` or ``"int4-a8"``, with ``group_size`` values a group; see the
    module doc for the math) and return ``model``. Layers torchao quantized are converted with
    their own codes; ``fmt=None`` converts only those. ``filter(name, module)`` returning False
    leaves a layer as it is (an ``lm_head`` kept in float, say). A layer that cannot take the
    format (int4 with ``in_features`` not a multiple of ``group_size``) is an error naming it,
    never skipped silently."""
    if fmt is not None and fmt not in FORMATS:
        raise QuantFormatError(
            f"cu.quantize: unknown format {fmt!r}; use one of {', '.join(map(repr, FORMATS))}"
        )
    if fmt in INT4_FORMATS:
        check_format(fmt, group_size)
    if isinstance(model, nn.Linear):
        raise TypeError(
            "cu.quantize replaces linear layers inside a module; for a lone nn.Linear use "
            "QuantizedLinear.from_linear(linear, fmt)"
        )
    # every layer is quantized before any is replaced: an error leaves the model as it was
    replacements: list[tuple[nn.Module, str, QuantizedLinear]] = []
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or type(child).forward is not nn.Linear.forward:
                continue  # a subclass with its own forward (LoRA ...) is not a plain linear
            full = f"{name}.{child_name}" if name else child_name
            if filter is not None and not filter(full, child):
                continue
            try:
                if is_torchao_weight(child.weight):
                    new = from_torchao(child)
                elif fmt is None:
                    continue
                else:
                    new = QuantizedLinear.from_linear(child, fmt, group_size)
            except QuantFormatError as e:
                raise QuantFormatError(f"layer {full!r}: {e}") from None
            replacements.append((parent, child_name, new))
    if fmt is None and not replacements:
        raise QuantFormatError(
            "cu.quantize(model) without a format converts torchao-quantized linears, and this model "
            "has none; pass a format: cu.quantize(model, 'int8')"
        )
    for parent, child_name, new in replacements:
        setattr(parent, child_name, new)
    return model


__all__ = [
    "QuantizedLinear",
    "from_torchao",
    "is_torchao_weight",
    "quantize",
    "quantize_weight",
    "unpack_int4",
    "weight_only_linear",
]
