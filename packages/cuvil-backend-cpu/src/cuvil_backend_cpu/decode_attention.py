"""A decode step's attention over a contiguous KV cache, by the paged-attention kernel.

A decoder's step with transformers' static cache calls ``sdpa`` with one query per
sequence against the whole cache (``max_cache_len`` positions) and a mask that allows each
sequence's first ``n`` positions: ``q [B, Hq, 1, D]``, ``k, v [B, Hk, S, D]``, mask
``[B, 1, 1, S]``. Torch's kernel repeats K and V per query head under grouped-query
attention and splits no work along the sequence. ``paged_attention.c`` already does what
such a step wants (the query heads of one kv head read each K/V row once; a long context
split across threads, flash-decoding style, and its parts merged), and it reads a
contiguous cache as one block of ``S`` positions per sequence with the identity block table
(its cache strides are parameters), so this is only the mapping, in one C call
(``cuvil_decode_attention``: each small torch op on this path costs microseconds):

* the mask must say "the first ``n_b`` positions" for every sequence ``b``: boolean
  ``True`` there and ``False`` after, or additive ``0`` there and ``-inf`` (or at most half
  float32's lowest, transformers' ``finfo.min``: ``exp`` of it is exactly 0) after, the
  same for every head; ``n_b >= 1``. Anything else (a padded batch's holes, ALiBi biases,
  a sliding window) is torch's: the C call says so and the caller runs torch's;
* the sequence lengths are read off the mask by the C call, in full, each step.

Measured (AVX2 Zen 3, 8 / 2 heads of 64, the whole ``sdpa`` extern call, 1 thread; docs/
cpu-backend.md "Paged attention"): batch 1, 96 positions 26 us against torch's 31-37; 1056:
74 vs 158-174; batch 4 x 1056: 206 vs 577-581. Below :data:`MIN_CACHED` cached positions
torch's call is as short or shorter (batch 1 x 16: 23 vs 20-27 us).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cuvil_backend_cpu.paged_attention import PagedAttentionKernel

#: cached positions (batch x positions) from which a decode step's attention runs the kernel
#: (measured, above)
MIN_CACHED = 64
#: an additive mask value at or below this drops its position exactly (``exp`` underflows to 0)
DROPPED = torch.finfo(torch.float32).min / 2


def attend(
    kernel: Callable[[], PagedAttentionKernel],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float,
    enable_gqa: bool,
) -> torch.Tensor | None:
    """``sdpa(q, k, v, mask, scale=scale, enable_gqa=...)`` for a decode step (see the
    module doc) by the kernel ``kernel()`` returns (built at the first step that uses it),
    or ``None`` where it does not apply."""
    if not (
        q.dim() == k.dim() == v.dim() == 4
        and q.shape[2] == 1
        and q.dtype == k.dtype == v.dtype == torch.float32
        and q.device.type == k.device.type == v.device.type == "cpu"
    ):
        return None
    batch, heads, _, dim = q.shape
    kv_heads, positions = k.shape[1], k.shape[2]
    if (
        batch * positions < MIN_CACHED
        or k.shape != v.shape
        or k.shape[0] != batch
        or k.shape[3] != dim
        or kv_heads == 0
        or (heads != kv_heads and not (enable_gqa and heads % kv_heads == 0))
    ):
        return None
    if mask is not None:
        if mask.dim() != 4 or mask.shape[1:] != (1, 1, positions) or mask.shape[0] not in (1, batch):
            return None  # per-head or per-query masks, or a broadcast along the positions
        if mask.dtype not in (torch.bool, torch.float32) or mask.device.type != "cpu":
            return None
        if mask.stride(3) != 1 and positions > 1:
            mask = mask.contiguous()
    q, k, v = (t if t.stride(3) == 1 or dim <= 1 else t.contiguous() for t in (q, k, v))
    return kernel().decode(q, k, v, mask, scale=scale, drop=DROPPED)


__all__ = ["DROPPED", "MIN_CACHED", "attend"]
