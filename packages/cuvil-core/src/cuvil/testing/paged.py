"""Varlen batches over a paged KV cache, for the tests of every target's ``paged_attention``
kernel (cuvil_ir/graph_ir/ops/paged.py, docs/paged-attention.md).

:func:`make_batch` builds a batch as a serving engine would: each sequence owns blocks taken in
a shuffled order (its blocks are not consecutive, nor in order in the cache), the step's own
keys are in the cache, unused table entries point anywhere in range, and sequences may share
their first blocks (a common prompt prefix). :func:`expected` computes the attention in
float64 from first principles (position by position through the block table, one sequence
at a time), independent of the op's reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    query: torch.Tensor  #: [tokens, heads, head_dim]
    key_cache: torch.Tensor  #: [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  #: int32 [batch, max_blocks]
    seq_lens: torch.Tensor  #: int32 [batch]
    query_start_loc: torch.Tensor  #: int32 [batch + 1]
    scale: float

    def operands(self) -> tuple[torch.Tensor, ...]:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
        )


def make_batch(
    seqs: list[tuple[int, int]],
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    shared_prefix_blocks: int = 0,
    spare_blocks: int = 3,
    seed: int = 0,
) -> PagedBatch:
    """A batch of sequences ``(seq_len, q_len)`` (``q_len`` 1: a decode step; more: a prefill
    chunk). With ``shared_prefix_blocks = n``, every sequence's first ``n`` blocks are the first
    sequence's (their lengths must cover them)."""
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil(n / block_size) for n, _ in seqs]
    own = [max(0, k - shared_prefix_blocks) if i else k for i, k in enumerate(need)]
    num_blocks = sum(own) + spare_blocks
    order = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(need, default=0) + 1
    tables = torch.randint(0, max(num_blocks, 1), (len(seqs), max_blocks), generator=g, dtype=torch.int32)
    taken = 0
    for i, k in enumerate(need):
        if i and shared_prefix_blocks:
            assert k >= shared_prefix_blocks, "a sequence shorter than the shared prefix"
            tables[i, :shared_prefix_blocks] = tables[0, :shared_prefix_blocks]
            start = shared_prefix_blocks
        else:
            start = 0
        for j in range(start, k):
            tables[i, j] = order[taken]
            taken += 1
    cdt = cache_dtype or dtype
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=g).to(cdt)
    value_cache = torch.randn(shape, generator=g).to(cdt)
    tokens = sum(q for _, q in seqs)
    query = torch.randn(tokens, heads, head_dim, generator=g).to(dtype)
    starts = [0]
    for _, q in seqs:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query,
        key_cache,
        value_cache,
        tables,
        torch.tensor([n for n, _ in seqs], dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        1.0 / math.sqrt(head_dim),
    )


def expected(batch: PagedBatch) -> torch.Tensor:
    """The attention of ``batch`` in float64, position by position (see the module doc)."""
    q, kc, vc = batch.query.double(), batch.key_cache.double(), batch.value_cache.double()
    tokens, heads, dim = q.shape
    _, block_size, kv_heads, _ = kc.shape
    group = heads // kv_heads
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    starts = batch.query_start_loc.tolist()
    for b, n in enumerate(batch.seq_lens.tolist()):
        rows = range(starts[b], starts[b + 1])
        table = batch.block_tables[b].tolist()
        slots = [(table[p // block_size], p % block_size) for p in range(n)]
        keys = torch.stack([kc[blk, off] for blk, off in slots]) if slots else kc.new_zeros(0, kv_heads, dim)
        values = torch.stack([vc[blk, off] for blk, off in slots]) if slots else keys
        for i, t in enumerate(rows):
            pos = n - len(rows) + i
            for h in range(heads):
                k, v = keys[: pos + 1, h // group], values[: pos + 1, h // group]
                p = torch.softmax(k @ q[t, h] * batch.scale, dim=0)
                out[t, h] = p @ v
    return out


#: mixed batches: (seq_len, q_len) per sequence -- prefill chunks and decode steps, lengths off
#: the block size (partial last blocks), a chunk that starts mid-sequence, a 1-token sequence
MIXED = [
    [(1, 1)],
    [(37, 37)],
    [(40, 1), (17, 5), (3, 3), (70, 1)],
    [(16, 1), (33, 12), (5, 1)],
    [(64, 64), (1, 1), (48, 16)],
]


def slot_mapping(batch: PagedBatch) -> torch.Tensor:
    """int64 ``[tokens]``: the cache slot of each query token's own position (the step's keys)."""
    block_size = batch.key_cache.shape[1]
    starts = batch.query_start_loc.tolist()
    slots = []
    for b, n in enumerate(batch.seq_lens.tolist()):
        q_len = starts[b + 1] - starts[b]
        for pos in range(n - q_len, n):
            slots.append(int(batch.block_tables[b, pos // block_size]) * block_size + pos % block_size)
    return torch.tensor(slots, dtype=torch.int64)


__all__ = ["MIXED", "PagedBatch", "expected", "make_batch", "slot_mapping"]
