"""``paged_attention`` (cuvil_ir/graph_ir/ops/paged.py) as one hand-written Triton kernel, shared
by the Triton targets: ``cuda`` (a GPU, or Triton's interpreter) and ``ascend`` (triton-ascend on
an NPU, or the interpreter in simulation), each launching it under its own rules.

One work item per (query token, kv head): the item holds the ``G`` query heads of the kv head as
the rows of its tiles (padded to a power of two), and walks the token's visible positions
``BLOCK_N`` at a time, each position's block found through the block table (so any block size
works, a power of two or not, and a contiguous cache with an identity table too). K and V are
loaded once per position tile for all ``G`` heads, in the cache's dtype and widened to float32;
scores, the online softmax (running max and sum) and the accumulator are float32; the result is
stored in the output's dtype (the query's). Products are broadcast multiplies and sums, not
``tl.dot``: a decode item has one row per query head (``G`` of 1 to 8), below ``tl.dot``'s least
tile, and the step reads K and V once whatever the arithmetic.

The program loops over items ``pid, pid + programs, ...``: the ``cuda`` target launches one
program per item, the ``ascend`` target at most one per vector core (its launch rule), with the
same source. The token's sequence is looked up on the host side with ``torch.searchsorted`` on
the device (no synchronisation); the batch's data are not checked here (the ``cpu`` kernel checks
them): a block number outside the cache reads out of bounds, as in vLLM's kernels.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from cuvil_ir.graph_ir.ops import paged


@triton.jit
def paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    seq_lens_ptr,
    starts_ptr,
    token_seq_ptr,
    n_items,
    kv_heads,
    group,
    head_dim,
    block_size,
    max_blocks,
    scale,
    q_st,
    q_sh,
    k_sb,
    k_sp,
    k_sh,
    v_sb,
    v_sp,
    v_sh,
    o_st,
    o_sh,
    GP: tl.constexpr,
    DP: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rg = tl.arange(0, GP)
    rd = tl.arange(0, DP)
    rn = tl.arange(0, BLOCK_N)
    gmask = rg < group
    dmask = rd < head_dim
    qmask = gmask[:, None] & dmask[None, :]
    for u in range(pid, n_items, programs):
        t = u // kv_heads
        g = u % kv_heads
        b = tl.load(token_seq_ptr + t)
        s0 = tl.load(starts_ptr + b)
        s1 = tl.load(starts_ptr + b + 1)
        pos = tl.load(seq_lens_ptr + b) - (s1 - s0) + (t - s0)  # the token's own position
        heads = g * group + rg
        q = tl.load(q_ptr + t * q_st + heads[:, None] * q_sh + rd[None, :], mask=qmask, other=0.0)
        q = q.to(tl.float32) * scale
        m = tl.full([GP], float("-inf"), tl.float32)
        s_sum = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, DP], tl.float32)
        table = tables_ptr + b * max_blocks
        for p0 in range(0, pos + 1, BLOCK_N):
            p = p0 + rn
            pmask = p <= pos
            blk = tl.load(table + p // block_size, mask=pmask, other=0).to(tl.int64)
            off = p % block_size
            kvmask = pmask[:, None] & dmask[None, :]
            k = tl.load(
                k_ptr + blk[:, None] * k_sb + off[:, None] * k_sp + g * k_sh + rd[None, :],
                mask=kvmask,
                other=0.0,
            ).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GP, BLOCK_N]
            s = tl.where(pmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: position p0 <= pos is visible
            alpha = tl.exp(m - m_new)
            pr = tl.exp(s - m_new[:, None])
            s_sum = s_sum * alpha + tl.sum(pr, axis=1)
            v = tl.load(
                v_ptr + blk[:, None] * v_sb + off[:, None] * v_sp + g * v_sh + rd[None, :],
                mask=kvmask,
                other=0.0,
            ).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * v[None, :, :], axis=1)
            m = m_new
        o = acc / s_sum[:, None]
        tl.store(
            out_ptr + t * o_st + heads[:, None] * o_sh + rd[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=qmask,
        )


def pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def tile_sizes(group: int, head_dim: int, block_n: int) -> dict[str, int]:
    """The kernel's constexprs: query heads and head_dim padded to powers of two."""
    return {"GP": pow2(group), "DP": max(16, pow2(head_dim)), "BLOCK_N": block_n}


def signature() -> dict[str, str]:
    """The kernel's argument types for ahead-of-time compiles (float32 operands, int32 sizes)."""
    pointers = {
        "out_ptr": "*fp32",
        "q_ptr": "*fp32",
        "k_ptr": "*fp32",
        "v_ptr": "*fp32",
        "tables_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "starts_ptr": "*i32",
        "token_seq_ptr": "*i32",
    }
    ints = ["n_items", "kv_heads", "group", "head_dim", "block_size", "max_blocks"]
    strides = ["q_st", "q_sh", "k_sb", "k_sp", "k_sh", "v_sb", "v_sp", "v_sh", "o_st", "o_sh"]
    sig = {**pointers, **dict.fromkeys(ints, "i32"), "scale": "fp32", **dict.fromkeys(strides, "i32")}
    return {**sig, "GP": "constexpr", "DP": "constexpr", "BLOCK_N": "constexpr"}


def launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float,
    block_n: int,
    programs: int | None = None,
    options: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``paged_attention(...)`` by the kernel: ``programs`` programs (default one per item),
    ``BLOCK_N`` positions per step, launch ``options`` passed on (``num_warps`` on CUDA, none
    on Ascend). Operands the op's checks reject raise its :class:`PagedShapeError`."""
    paged.check_paged(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    tokens, heads, dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    q, kc, vc = (
        t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()
        for t in (query, key_cache, value_cache)
    )
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    items = tokens * kv_heads
    if items == 0 or dim == 0:
        return out
    tables, lens, starts = (t.contiguous() for t in (block_tables, seq_lens, query_start_loc))
    rows = torch.arange(tokens, device=query.device, dtype=torch.int32)
    token_seq = torch.searchsorted(starts[1:], rows, right=True).to(torch.int32)
    grid = (max(1, min(items, programs or items)),)
    paged_attention_kernel[grid](
        out, q, kc, vc, tables, lens, starts, token_seq,
        items, kv_heads, heads // kv_heads, dim, block_size, tables.shape[1], float(scale),
        q.stride(0), q.stride(1), *kc.stride()[:3], *vc.stride()[:3], out.stride(0), out.stride(1),
        **tile_sizes(heads // kv_heads, dim, block_n), **(options or {}),
    )  # fmt: skip
    return out


__all__ = ["launch", "paged_attention_kernel", "pow2", "signature", "tile_sizes"]
