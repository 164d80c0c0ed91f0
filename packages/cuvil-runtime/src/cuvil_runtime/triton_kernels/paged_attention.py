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
same source. Where the (token, kv head) items are fewer than the programs a device runs at once
(a decode step of few sequences), each is split along the sequence into chunks
(:func:`plan_splits`, flash-decoding: from the shapes, no synchronisation), each chunk leaves its
rows' max, sum and accumulator in a scratch buffer, and :func:`paged_attention_merge` merges them. The token's sequence is looked up on the host side with ``torch.searchsorted`` on
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
    part_acc_ptr,
    part_ml_ptr,
    n_items,
    kv_heads,
    splits,
    chunk,
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
        t = u // (kv_heads * splits)
        g = (u // splits) % kv_heads
        c = u % splits  # the split: positions [c * chunk, (c + 1) * chunk)
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
        for p0 in range(c * chunk, tl.minimum((c + 1) * chunk, pos + 1), BLOCK_N):
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
        if splits == 1:
            o = acc / s_sum[:, None]
            tl.store(
                out_ptr + t * o_st + heads[:, None] * o_sh + rd[None, :],
                o.to(out_ptr.dtype.element_ty),
                mask=qmask,
            )
        else:  # this split's rows: max, sum and accumulator, merged by paged_attention_merge
            row = (t * kv_heads * group + heads) * splits + c  # (token, head) rows, then splits
            tl.store(part_acc_ptr + row[:, None] * head_dim + rd[None, :], acc, mask=qmask)
            tl.store(part_ml_ptr + row * 2, m, mask=gmask)
            tl.store(part_ml_ptr + row * 2 + 1, s_sum, mask=gmask)


@triton.jit
def paged_attention_merge(
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    n_rows,
    heads,
    head_dim,
    splits,
    o_st,
    o_sh,
    SP: tl.constexpr,
    DP: tl.constexpr,
):
    """One (token, head) row per step: ``M = max_c m_c``, ``out = sum_c e^(m_c - M) acc_c /
    sum_c e^(m_c - M) l_c`` (a split the row does not reach has ``m = -inf``, weight 0)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rs = tl.arange(0, SP)
    rd = tl.arange(0, DP)
    smask = rs < splits
    dmask = rd < head_dim
    for r in range(pid, n_rows, programs):
        base = r * splits + rs
        m = tl.load(part_ml_ptr + base * 2, mask=smask, other=float("-inf"))
        s_sum = tl.load(part_ml_ptr + base * 2 + 1, mask=smask, other=0.0)
        acc = tl.load(
            part_acc_ptr + base[:, None] * head_dim + rd[None, :],
            mask=smask[:, None] & dmask[None, :],
            other=0.0,
        )
        big = tl.max(m, axis=0)  # finite: split 0 holds position 0
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - big))
        o = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * s_sum, axis=0)
        t = r // heads
        h = r % heads
        tl.store(out_ptr + t * o_st + h * o_sh + rd, o.to(out_ptr.dtype.element_ty), mask=dmask)


def pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def tile_sizes(group: int, head_dim: int, block_n: int) -> dict[str, int]:
    """The kernel's constexprs: query heads and head_dim padded to powers of two."""
    return {"GP": pow2(group), "DP": max(16, pow2(head_dim)), "BLOCK_N": block_n}


#: positions per split at least (flash-decoding's partition: vLLM's v2 kernel takes 512)
SPLIT_CHUNK = 512
#: splits per item at most
MAX_SPLITS = 16


def plan_splits(
    items: int, span: int, block_n: int, target: int, split_chunk: int = SPLIT_CHUNK
) -> tuple[int, int]:
    """``(splits, chunk)``: how many chunks of ``chunk`` positions (a multiple of ``block_n``)
    each (token, kv head) item is split into, from the shapes alone (no synchronisation):
    ``span`` (``max_blocks * block_size``) bounds every context. Split only while the items
    are fewer than ``target`` programs (a GPU's multiprocessors, Ascend's cores) and the span
    holds two chunks; chunks past a token's position do nothing."""
    if items >= target or span < 2 * split_chunk:
        return 1, max(span, 1)
    splits = min(MAX_SPLITS, span // split_chunk, -(-target // max(items, 1)))
    if splits <= 1:
        return 1, max(span, 1)
    per_split = _ceil_div(span, splits)
    chunk = _ceil_div(per_split, block_n) * block_n
    return _ceil_div(span, chunk), chunk


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
        "part_acc_ptr": "*fp32",
        "part_ml_ptr": "*fp32",
    }
    ints = ["n_items", "kv_heads", "splits", "chunk", "group", "head_dim", "block_size", "max_blocks"]
    strides = ["q_st", "q_sh", "k_sb", "k_sp", "k_sh", "v_sb", "v_sp", "v_sh", "o_st", "o_sh"]
    sig = {**pointers, **dict.fromkeys(ints, "i32"), "scale": "fp32", **dict.fromkeys(strides, "i32")}
    return {**sig, "GP": "constexpr", "DP": "constexpr", "BLOCK_N": "constexpr"}


def merge_signature(dtype: str = "fp32") -> dict[str, str]:
    """:func:`paged_attention_merge`'s argument types (the output in ``dtype``)."""
    sig = {"out_ptr": f"*{dtype}", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32"}
    sig |= dict.fromkeys(["n_rows", "heads", "head_dim", "splits", "o_st", "o_sh"], "i32")
    return {**sig, "SP": "constexpr", "DP": "constexpr"}


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
    target: int = 0,
    split_chunk: int = SPLIT_CHUNK,
    options: dict[str, Any] | None = None,
) -> torch.Tensor:
    """``paged_attention(...)`` by the kernel: at most ``programs`` programs (default one per
    item), ``BLOCK_N`` positions per step, items split along the sequence while fewer than
    ``target`` (:func:`plan_splits`; 0: never), launch ``options`` passed on (``num_warps`` on
    CUDA, none on Ascend). Operands the op's checks reject raise its :class:`PagedShapeError`."""
    paged.check_paged(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    tokens, heads, dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    q, kc, vc = (
        t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()
        for t in (query, key_cache, value_cache)
    )
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if tokens * kv_heads == 0 or dim == 0:
        return out
    tables, lens, starts = (t.contiguous() for t in (block_tables, seq_lens, query_start_loc))
    rows = torch.arange(tokens, device=query.device, dtype=torch.int32)
    token_seq = torch.searchsorted(starts[1:], rows, right=True).to(torch.int32)
    span = tables.shape[1] * block_size
    splits, chunk = plan_splits(tokens * kv_heads, span, block_n, target, split_chunk)
    items = tokens * kv_heads * splits
    part_acc = part_ml = torch.empty(1, device=query.device, dtype=torch.float32)  # (unused: one split)
    if splits > 1:
        part_acc = torch.empty(tokens * heads * splits * dim, device=query.device, dtype=torch.float32)
        part_ml = torch.empty(tokens * heads * splits * 2, device=query.device, dtype=torch.float32)
    grid = (max(1, min(items, programs or items)),)
    paged_attention_kernel[grid](
        out, q, kc, vc, tables, lens, starts, token_seq, part_acc, part_ml,
        items, kv_heads, splits, chunk, heads // kv_heads, dim, block_size, tables.shape[1], float(scale),
        q.stride(0), q.stride(1), *kc.stride()[:3], *vc.stride()[:3], out.stride(0), out.stride(1),
        **tile_sizes(heads // kv_heads, dim, block_n), **(options or {}),
    )  # fmt: skip
    if splits > 1:
        n_rows = tokens * heads
        paged_attention_merge[(max(1, min(n_rows, programs or n_rows)),)](
            out, part_acc, part_ml, n_rows, heads, dim, splits, out.stride(0), out.stride(1),
            SP=pow2(splits), DP=max(16, pow2(dim)), **(options or {}),
        )  # fmt: skip
    return out


__all__ = [
    "MAX_SPLITS",
    "SPLIT_CHUNK",
    "launch",
    "merge_signature",
    "paged_attention_kernel",
    "paged_attention_merge",
    "plan_splits",
    "pow2",
    "signature",
    "tile_sizes",
]
