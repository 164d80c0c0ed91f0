"""The model step: one varlen batch of a Llama-family decoder over a paged KV cache
(docs/serving.md, "Step inputs", "The model step").

``PagedLlama`` reuses the transformers model's own modules and weights; its forward is
the function ``cu.compile`` compiles (one artifact: every size a symbol). ``StepInputs``
packs a scheduled batch into the tensors the step takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from cuvil_ir.graph_ir.ops.paged import paged_attention, paged_cache_write
from cuvil_serve.sequence import Sequence


class PagedLlama(nn.Module):
    """``forward(input_ids, positions, slot_mapping, block_tables, seq_lens, query_start_loc,
    key_caches, value_caches)`` -> logits ``[batch, vocab]`` of each sequence's last token.

    Works for transformers' ``LlamaForCausalLM`` and the models with its layout (a
    ``model`` with ``embed_tokens``, ``layers`` of ``self_attn`` (``q/k/v/o_proj``),
    ``mlp``, ``input_layernorm``, ``post_attention_layernorm``; ``norm``, ``rotary_emb``;
    ``lm_head``): Mistral without its window, Qwen2 (projection biases are the modules').
    """

    def __init__(self, model: Any, attention: Any = paged_attention) -> None:
        super().__init__()
        self.model: Any = model
        #: ``paged_attention`` (the op: what cu.compile captures) or ``sdpa_paged_attention``
        #: (the eager engine's: the same contract, faster in eager torch)
        self.attention = attention
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_layers = config.num_hidden_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        inner: Any = self.model.model
        h = inner.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = inner.rotary_emb(h, positions[None])  # [1, T, head_dim]
        cos = cos[0]
        sin = sin[0]
        for i, layer in enumerate(inner.layers):
            attn: Any = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(-1, self.num_heads, self.head_dim)
            k = attn.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
            v = attn.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            paged_cache_write(k, v, key_caches[i], value_caches[i], slot_mapping)
            o = self.attention(
                q, key_caches[i], value_caches[i], block_tables, seq_lens, query_start_loc, scale=attn.scaling
            )
            h = h + attn.o_proj(o.reshape(-1, self.num_heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = query_start_loc[1:].long() - 1
        h = inner.norm(h.index_select(0, last))
        logits: torch.Tensor = self.model.lm_head(h)
        return logits


def sdpa_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """``paged_attention``'s contract (cuvil_ir.graph_ir.ops.paged) for the eager engine: per
    sequence, its cached keys and values gathered from its blocks and one
    ``scaled_dot_product_attention`` (GQA, causal from the sequence's offset). The op's
    float32 reference materializes every query token's keys; this does not."""
    _, block_size, kv_heads, dim = key_cache.shape
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for b, length in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        blocks = block_tables[b, : -(-length // block_size)].long()
        k = key_cache[blocks].reshape(-1, kv_heads, dim)[:length].transpose(0, 1)  # [kv_heads, L, dim]
        v = value_cache[blocks].reshape(-1, kv_heads, dim)[:length].transpose(0, 1)
        q = query[lo:hi].transpose(0, 1)  # [heads, q_len, dim]
        mask = None
        if hi - lo > 1:  # row i sees positions up to length - q_len + i
            rows = torch.arange(length - (hi - lo), length)
            mask = torch.arange(length)[None, :] <= rows[:, None]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[lo:hi] = o.transpose(0, 1)
    return out


def make_caches(
    model: Any, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Zeroed key and value caches per layer, ``[num_blocks, block_size, kv_heads, head_dim]``."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (num_blocks, block_size, config.num_key_value_heads, head_dim)
    keys = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
    values = [torch.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
    return keys, values


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]
    query_start_loc: torch.Tensor  # int32 [B + 1]

    @classmethod
    def build(cls, items: list[tuple[Sequence, int]], block_size: int) -> StepInputs:
        """The tensors for ``items`` ((sequence, tokens to compute)); each sequence's blocks
        already cover ``num_computed + n`` tokens."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        max_blocks = max(len(seq.table.blocks) for seq, _ in items)
        rows: list[list[int]] = []
        for seq, n in items:
            lo, hi = seq.num_computed, seq.num_computed + n
            ids += seq.token_ids[lo:hi]
            blocks = seq.table.blocks
            positions += range(lo, hi)
            if n == 1:  # a decode token
                slots.append(blocks[lo // block_size] * block_size + lo % block_size)
            else:
                slots += [blocks[p // block_size] * block_size + p % block_size for p in range(lo, hi)]
            seq_lens.append(hi)
            starts.append(starts[-1] + n)
            rows.append(blocks + [0] * (max_blocks - len(blocks)))
        # one tensor per operand, made from Python lists once (not a tensor per sequence)
        return cls(
            torch.tensor(ids, dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64),
            torch.tensor(slots, dtype=torch.int64),
            torch.tensor(rows, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32),
            torch.tensor(starts, dtype=torch.int32),
        )

    def args(self, key_caches: list[torch.Tensor], value_caches: list[torch.Tensor]) -> tuple[Any, ...]:
        return (
            self.input_ids,
            self.positions,
            self.slot_mapping,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            key_caches,
            value_caches,
        )


__all__ = ["PagedLlama", "StepInputs", "make_caches", "sdpa_paged_attention"]
