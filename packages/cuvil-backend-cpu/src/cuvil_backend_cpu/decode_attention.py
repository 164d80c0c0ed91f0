"""A decode step's attention over a contiguous KV cache, by the paged-attention kernel.

A decoder's step with transformers' static cache calls ``sdpa`` with one query per
sequence against the whole cache (``max_cache_len`` positions) and a mask that allows each
sequence's first ``n`` positions: ``q [B, Hq, 1, D]``, ``k, v [B, Hk, S, D]``, mask
``[B, 1, 1, S]``. Torch's kernel repeats K and V per query head under grouped-query
attention and splits no work along the sequence. ``paged_attention.c`` already does what
such a step wants (the query heads of one kv head read each K/V row once; a long context
split across threads, flash-decoding style, and its parts merged), and it reads a
contiguous cache as one block of ``S`` positions per sequence with the identity block table
(its cache strides are parameters), so this module is only the mapping:

* the mask must say "the first ``n_b`` positions" for every sequence ``b``: boolean
  ``True`` there and ``False`` after, or additive ``0`` there and ``-inf`` (or at most half
  float32's lowest, transformers' ``finfo.min``: ``exp`` of it is exactly 0) after, the
  same for every head; ``n_b >= 1``. Anything else (a padded batch's holes, ALiBi biases,
  a sliding window) is torch's;
* the sequence lengths come from the mask, checked in full, each call (a few tensor ops).

Measured (AVX2 Zen 3, 8 / 2 heads of 64, the whole ``sdpa`` call; docs/cpu-backend.md
"Attention"): 2 threads, batch 1, 1056 cached positions 131 us against torch's 157-171, 4096:
~350 vs ~800 (1 thread); batch 4 x 512: 157-163 vs 255-270. The call costs ~90 us whatever
the size on this host (Python, ctypes, the mask's check), so steps of fewer than
:data:`MIN_CACHED` cached positions (batch x positions) stay torch's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cuvil_backend_cpu.paged_attention import PagedAttentionKernel

#: cached positions (batch x positions) from which a decode step's attention runs the kernel
#: (measured, above: batch 1 from 1024 positions, batch 4 from 256)
MIN_CACHED = 1024
#: an additive mask value at or below this drops its position exactly (``exp`` underflows to 0)
_DROPPED = torch.finfo(torch.float32).min / 2


def lengths(
    kernel: PagedAttentionKernel, mask: torch.Tensor | None, batch: int, positions: int
) -> torch.Tensor | None:
    """Per sequence, ``n`` when ``mask`` (broadcastable to ``[batch, heads, 1, positions]``,
    the same for every head) allows exactly the first ``n >= 1`` positions, as int32;
    ``None`` when it says anything else. (One C call, ``cuvil_prefix_lengths``: in torch or
    numpy the handful of small-tensor ops cost as much as the attention.)"""
    if mask is None:
        return torch.full((batch,), positions, dtype=torch.int32)
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 or mask.shape[3] != positions:
        return None
    if mask.shape[0] not in (1, batch) or mask.dtype not in (torch.bool, torch.float32):
        return None
    rows = mask[:, 0, 0, :]
    if rows.stride(1) != 1 and positions > 1:
        rows = rows.contiguous()
    if rows.shape[0] != batch:
        rows = rows.expand(batch, positions)  # (a zero row stride: one row for every sequence)
    return kernel.prefix_lengths(rows, _DROPPED)


def _identity(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The identity block table ``[[0], [1], ...]`` and the query starts ``0, 1, ..., batch``."""
    got = _IDENTITY.get(batch)
    if got is None:
        got = (
            torch.arange(batch, dtype=torch.int32).view(batch, 1),
            torch.arange(batch + 1, dtype=torch.int32),
        )
        if len(_IDENTITY) < 64:
            _IDENTITY[batch] = got
    return got


_IDENTITY: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


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
    pa = kernel()
    lens = lengths(pa, mask, batch, positions)
    if lens is None:
        return None
    # the cache as `batch` blocks of `positions`: [block, offset, kv head, dim] views; the
    # operands are consistent by construction (the kernel still checks lengths and tables)
    tables, starts = _identity(batch)
    out = pa(q[:, :, 0], k.transpose(1, 2), v.transpose(1, 2), tables, lens, starts, scale=scale, check=False)
    return out.view(batch, heads, 1, dim)


__all__ = ["MIN_CACHED", "attend", "lengths"]
