"""Attention (the Graph IR op ``sdpa``) as the ``cpu`` target's own flash kernel.

``attention.c`` is written once (not generated): float32, online softmax over blocks
of keys, causal, boolean and additive masks broadcast over batch and heads,
grouped-query heads, any scale, threads over batch x heads x query blocks. It is
built by the target's kernel cache like any generated kernel (same compiler, flags,
ISA, signature checks) and called through ctypes with the GIL released.

:func:`extern` is what an ``sdpa`` extern call runs on the ``cpu`` target: a decode step
over a cache (one query per sequence, a prefix mask) the paged-attention kernel's decode
entry (:mod:`cuvil_backend_cpu.decode_attention`); otherwise this kernel where it applies
and wins, else the op's eager reference (float64, batch dimensions that broadcast between
q, k and v, head counts eager rejects, and sizes where torch's kernel is faster: other
few-query calls and small problems, :data:`MIN_SCORES`).
Float16/bfloat16 attention runs torch's in the half type or the float32 path on widened
operands, whichever measured faster for the shape (:func:`_half_sdpa`).
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cpu import attention_pattern, decode_attention, gemm_choice, paged_attention
from cuvil_backend_cpu.c_prelude import build_facts, kernel_source
from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache

#: the kernel's source, the vector prelude in place (:mod:`cuvil_backend_cpu.c_prelude`)
SOURCE = kernel_source("attention.c")

#: queries per work item and keys per block (rounded up to the kernel's tile sizes);
#: measured with benchmarks/attention.py (docs/cpu-backend.md, "Attention")
BLOCK_Q = 48
BLOCK_K = 128

#: fewer scores (batch x heads x queries x keys) than this run torch's own kernel, whose
#: cost per call is lower; so do fewer queries than one tile holds (decode steps: a tile
#: computes its whole width of queries). Measured with benchmarks/attention.py.
MIN_SCORES = 1 << 17

_MASK_KIND = {torch.float32: 1, torch.bool: 2}


class FlashAttention:
    """The compiled kernel of ``attention.c``, loaded from ``cache``."""

    def __init__(self, cache: KernelCache, lanes: int | None = None) -> None:
        """``lanes`` forces the vector width (tests: the AVX-512 tiling on any host)."""
        source = kernel_source("attention.c", lanes)
        lib = cache.load(cache.build(source, name="attention"), source, name="attention")
        self._fn = lib.cuvil_attention
        self._fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_char_p, ctypes.c_float]
        self._fn.restype = ctypes.c_int
        #: an emulated kernel (:mod:`cuvil_backend_cpu.emulation`) takes tensors, not addresses
        self._tensors = isinstance(lib, EmulatedLibrary)
        mr, nr = build_facts(lib, "cuvil_attention_tile", 2)
        self.tile_queries = nr  # queries lie across a tile's columns
        self.block_q = -(-BLOCK_Q // nr) * nr
        self.block_k = -(-BLOCK_K // mr) * mr  # keys down its rows

    def faster_than_torch(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether this kernel beats torch's on these sizes (see :data:`MIN_SCORES`)."""
        rows = q.numel() // max(q.shape[-1], 1)
        return q.shape[-2] >= self.tile_queries and rows * k.shape[-2] >= MIN_SCORES

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        empty_nan: bool = False,
    ) -> torch.Tensor | None:
        """``F.scaled_dot_product_attention(q, k, v, mask, ...)``, or ``None`` where the
        kernel does not apply (the caller then runs eager's). A query that sees no key
        gets zeros (sdpa's answer), or NaN with ``empty_nan`` (``softmax(s) @ v``'s).
        Float32 tensors, or bfloat16 ones (read and written as such, float32 between)."""
        if not _fits(q, k, v, mask, enable_gqa, is_causal, bf16=not self._tensors):
            return None
        lead, L, E, S, Ev = q.shape[:-2], q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
        q4, k4, v4 = _rank4(q), _rank4(k), _rank4(v)
        B, Hq, Hk = q4.shape[0], q4.shape[1], k4.shape[1]
        out = torch.empty((B, Hq, L, Ev), dtype=q.dtype)
        if out.numel() == 0:
            return out.view(*lead, L, Ev)
        ms: tuple[int, ...] = (0, 0, 0)
        kind, m4 = 0, None
        if mask is not None:
            if mask.dtype == torch.bfloat16:  # (the kernel adds float32 masks)
                mask = mask.float()
            # a broadcast mask is a view with zero strides: no copy, unless its keys do not
            # lie consecutively (a mask broadcast along the keys)
            m4 = _rank4(mask.expand(*lead, L, S))
            kind, ms = _MASK_KIND[mask.dtype], m4.stride()[:3]
        params = struct.pack(
            "26q", B, Hq, Hk, L, S, E, Ev,
            *q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3], *ms,
            kind, int(is_causal), self.block_q, self.block_k, torch.get_num_threads(), int(empty_nan),
            int(q.dtype == torch.bfloat16),
        )  # fmt: skip
        tensors = (q4, k4, v4, m4, out)
        ptrs = tensors if self._tensors else tuple(None if t is None else t.data_ptr() for t in tensors)
        if self._fn(*ptrs, params, 1.0 / math.sqrt(E) if scale is None else scale):
            raise MemoryError(f"attention of {tuple(q.shape)} x {tuple(k.shape)}: out of memory")
        return out if q.dim() == 4 else out.view(*lead, L, Ev)


def _fits(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    enable_gqa: bool,
    is_causal: bool,
    bf16: bool = False,
) -> bool:
    """Whether the kernel runs these (``bf16``: bfloat16 tensors too; an emulated kernel,
    which takes tensors, runs float32 only)."""
    dtypes = (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)
    if not (q.dtype == k.dtype == v.dtype and q.dtype in dtypes) or not (
        q.device.type == k.device.type == v.device.type == "cpu"
    ):
        return False
    if not (2 <= q.dim() == k.dim() == v.dim()) or q.shape[-1] == 0:
        return False
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-2] != v.shape[:-2]:
        return False  # batch dimensions that broadcast: eager's
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        return False  # eager raises its own error
    if q.dim() > 2:
        hq, hk = q.shape[-3], k.shape[-3]
        if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
            return False
    if mask is not None:
        if is_causal or (mask.dtype not in _MASK_KIND and mask.dtype != q.dtype) or mask.dim() > q.dim():
            return False
        target = (*q.shape[:-1], k.shape[-2])
        if any(m != 1 and m != t for m, t in zip(reversed(mask.shape), reversed(target))):
            return False
    return True


def _rank4(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (batch, heads, rows, columns) with unit stride along the columns (a view
    where strides allow, which covers transposed heads: transformers' q, k, v)."""
    if t.dim() == 2:
        t = t[None, None]
    elif t.dim() == 3:
        t = t[None]
    elif t.dim() > 4:
        t = t.reshape(-1, *t.shape[-3:])
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    return t


def kernel(cache: KernelCache) -> FlashAttention:
    """The attention kernel built and loaded from ``cache``, once per cache."""
    return per_cache(FlashAttention, cache)


def extern(cache: KernelCache, reference: Callable[..., Any]) -> Callable[..., Any]:
    """What an ``sdpa`` extern call runs: the kernel, or ``reference`` (eager's) where
    the kernel does not apply or would be slower."""
    flash = kernel(cache)

    def sdpa(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *mask: torch.Tensor,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        has_mask: bool,
    ) -> torch.Tensor:
        if q.dtype in _HALF and q.dtype == k.dtype == v.dtype:
            return _half_sdpa(
                sdpa,
                reference,
                flash,
                q,
                k,
                v,
                *mask,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        if q.dim() == 4 and q.shape[-2] == 1 and not is_causal:  # a decode step over a cache
            e = q.shape[-1]
            out = decode_attention.attend(
                lambda: paged_attention.kernel(cache), q, k, v, mask[0] if has_mask else None,
                scale=1.0 / math.sqrt(e) if scale is None else scale, enable_gqa=enable_gqa,
            )  # fmt: skip
            if out is not None:
                return out
        if flash.faster_than_torch(q, k):
            out = flash(
                q,
                k,
                v,
                mask[0] if has_mask else None,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
            if out is not None:
                return out
        return reference(
            q, k, v, *mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, has_mask=has_mask
        )

    return sdpa


_HALF = (torch.float16, torch.bfloat16)


def _half_sdpa(
    wide: Callable[..., torch.Tensor],
    reference: Callable[..., Any],
    flash: FlashAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *mask: torch.Tensor,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """Half-precision attention: torch's in the half type, or q, k, v (and a float mask)
    widened to float32, the float32 path (this kernel where it wins) and the result
    rounded once, or (bfloat16) this kernel reading and writing bfloat16, the fastest for
    this shape, measured at its first call as GEMMs are ([Note: half-precision GEMMs]). Measured 1 thread on an AVX512-BF16 EPYC: float16
    GPT-2-sized causal attention 2.2 ms in float16, 0.77 widened; a bfloat16 decode
    step (1 query, 512 keys) 1.0 vs 0.3; a Whisper-sized bfloat16 one 47 vs 48."""
    kw = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa, "has_mask": bool(mask)}

    def widened() -> torch.Tensor:
        m = tuple(t.float() if t.is_floating_point() else t for t in mask)
        return wide(q.float(), k.float(), v.float(), *m, **kw).to(q.dtype)

    run = {"eager": lambda: reference(q, k, v, *mask, **kw), "f32": widened}
    m = mask[0] if mask else None
    if q.dtype == torch.bfloat16 and _fits(q, k, v, m, enable_gqa, is_causal, bf16=not flash._tensors):
        run["flash"] = lambda: flash(q, k, v, m, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    heads = q.numel() // max(q.shape[-1] * q.shape[-2], 1)
    shape = gemm_choice.key(
        heads * q.shape[-2], q.shape[-1], k.shape[-2], bool(mask), dtype=q.dtype, batch=heads
    )
    return run[gemm_choice.choose(f"sdpa{'-causal' if is_causal else ''}:{shape}", run)]()


def pattern_extern(cache: KernelCache, reference: Callable[..., Any]) -> Callable[..., Any]:
    """What a ``cpu_attention`` call (:mod:`cuvil_backend_cpu.attention_pattern`) runs: the
    kernel, or ``reference`` (the composition, op for op) where the kernel does not apply
    or the queries are too few to pay (:data:`attention_pattern.MIN_QUERIES`)."""
    flash = kernel(cache)

    def attend(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *mask: torch.Tensor,
        key_transposed: bool,
        scale: str,
        factor: float,
        mask_kind: str,
    ) -> torch.Tensor:
        if q.dtype in _HALF:
            kw = {"key_transposed": key_transposed, "scale": scale, "factor": factor, "mask_kind": mask_kind}
            return _half_pattern(reference, flash, q, k, v, *mask, **kw)
        if q.dim() >= 2 and q.shape[-2] >= attention_pattern.MIN_QUERIES:
            m = mask[0] if mask else None
            if mask_kind == "drop" and m is not None and m.dtype == torch.bool:
                m = ~m  # (the mask's size: the scores' last two dims at most, not the scores')
            key = k.transpose(-1, -2) if key_transposed else k
            # k heads of 1 broadcast over q's in the matmul: grouped-query heads, one group
            gqa = q.dim() > 2 and key.dim() == q.dim() and key.shape[-3] == 1 and v.shape[-3] == 1
            out = flash(
                q,
                key,
                v,
                m,
                scale=attention_pattern.kernel_scale(scale, factor),
                enable_gqa=gqa,
                empty_nan=True,
            )
            if out is not None:
                return out
        return reference(
            q, k, v, *mask, key_transposed=key_transposed, scale=scale, factor=factor, mask_kind=mask_kind
        )

    return attend


def _half_pattern(
    reference: Callable[..., Any],
    flash: FlashAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *mask: torch.Tensor,
    **kw: Any,
) -> torch.Tensor:
    """A half-precision ``cpu_attention``: torch's attention in the half type (its CPU flash
    kernel, bfloat16 on the AMX/AVX512-BF16 units where the CPU has them) or the composition
    op for op (eager's own roundings), or (bfloat16) this kernel reading and writing
    bfloat16, the fastest for this shape, measured at its first call as GEMMs are. Torch's computes the scores and probabilities in float32 and rounds once
    (the composition rounds the scores, the scaled scores and the probabilities to the half
    type): results differ within half-precision tolerance. A query that sees no key is NaN
    in the composition and zeros in torch's attention: a call with one runs the composition.
    Batch dimensions that broadcast (grouped-query heads of one) run the composition too."""
    m = mask[0] if mask else None
    key = k.transpose(-1, -2) if kw["key_transposed"] else k
    if m is not None and kw["mask_kind"] == "drop":
        m = ~m
    usable = q.dim() >= 3 and q.shape[:-2] == key.shape[:-2] == v.shape[:-2] and q.shape[-2] > 0
    if usable and m is not None:
        sees_none = ~m.any(-1) if m.dtype == torch.bool else torch.isneginf(m).all(-1)
        usable = not bool(sees_none.any())
    if not usable:
        return reference(q, k, v, *mask, **kw)
    factor = attention_pattern.kernel_scale(kw["scale"], kw["factor"])

    def theirs() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, key, v, attn_mask=m, scale=factor)

    run = {"eager": lambda: reference(q, k, v, *mask, **kw), "sdpa": theirs}
    if q.dtype == torch.bfloat16 and _fits(q, key, v, m, False, False, bf16=not flash._tensors):
        run["flash"] = lambda: flash(q, key, v, m, scale=factor, empty_nan=True)  # type: ignore[assignment]
    heads = q.numel() // max(q.shape[-1] * q.shape[-2], 1)
    shape = gemm_choice.key(
        heads * q.shape[-2], q.shape[-1], key.shape[-2], m is not None, dtype=q.dtype, batch=heads
    )
    return run[gemm_choice.choose(f"pattern-{kw['mask_kind']}:{shape}", run)]()
