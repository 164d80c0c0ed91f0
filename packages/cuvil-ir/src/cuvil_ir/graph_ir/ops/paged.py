"""A paged KV cache and attention over it: ``paged_cache_write`` and ``paged_attention``
(the serving issue; docs/serving.md).

A paged cache keeps the keys (and, in a second tensor, the values) of many sequences in
fixed-size blocks: ``key_cache`` is ``[num_blocks, block_size, kv_heads, head_dim]``. A
sequence owns a list of blocks, its row of ``block_tables`` (``int32 [batch, max_blocks]``,
unused entries anything in range); its token at position ``p`` lives in block
``block_tables[b, p // block_size]`` at offset ``p % block_size``, so the slot of that token
in the cache seen as ``[num_blocks * block_size, kv_heads, head_dim]`` is
``block * block_size + offset`` (the slot mapping the engine computes).

One step of a serving engine runs a *varlen batch*: the query tokens of all sequences
packed in one ``[tokens, heads, head_dim]`` tensor, sequence ``b``'s being rows
``query_start_loc[b]:query_start_loc[b + 1]`` (``int32 [batch + 1]``, starting at 0). They
are the *last* ``q_len_b`` tokens of that sequence, whose length with them is
``seq_lens[b]`` (``int32 [batch]``): a decode step has ``q_len_b = 1``, a prefill chunk more.
Attention is causal within each sequence: query row ``i`` of sequence ``b``, at position
``seq_lens[b] - q_len_b + i``, attends to the cache positions up to and including its own.
Grouped-query attention: ``heads`` is a multiple of ``kv_heads``; query head ``h`` reads kv
head ``h // (heads // kv_heads)``. The cache is written before attention reads it (the
step's own keys are in the cache).

This module holds the torch callables, their references (float32 softmax and
accumulation, the result in the query's dtype) and the Graph IR op :class:`PagedAttention`,
following the pattern of ``weight_only_linear`` (ops/quant.py): in eager
:func:`paged_attention` runs :func:`reference`; captured, it is one ``paged_attention``
node, which the ``cpu`` target runs with its own C kernel
(``cuvil_backend_cpu/paged_attention.c``), the ``cuda`` and ``ascend`` targets with a Triton
kernel (``cuvil_runtime/triton_kernels/paged_attention.py``) and every other consumer
through the reference (docs/paged-attention.md).

:func:`paged_cache_write` needs no op of its own: it is two ``index_put_`` calls on the
caches (block and offset of each slot), overwrites of argument tensors that a compiled
function performs on the caller's caches themselves, with no clone or copy back
([Note: updates in place] in ``cuvil_ir/graph_ir/in_place.py``). (``index_copy_`` on the
flattened ``view`` of the cache, the first form, is the same write but an in-place update
through a view, which capture refuses.)
"""

from __future__ import annotations

from typing import Any

import torch

from cuvil_ir.graph_ir.ops._rules import ShapeError, check_divisible, check_equal, device_of, tensor_of
from cuvil_ir.graph_ir.registry import Emitter, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

#: the block sizes the kernels are tuned and tested for (any positive size is accepted)
BLOCK_SIZES = (16, 32)


class PagedShapeError(ValueError):
    """Operands of a paged op that do not fit together; the message says which and how."""


def check_paged(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    """Raise :class:`PagedShapeError` unless the operands are a paged attention call."""
    if query.dim() != 3 or not query.is_floating_point():
        raise PagedShapeError(
            f"paged_attention: query must be a float [tokens, heads, head_dim] tensor, got "
            f"{query.dtype} {tuple(query.shape)}"
        )
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise PagedShapeError(
            "paged_attention: key_cache and value_cache must both be [num_blocks, block_size, kv_heads, "
            f"head_dim], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if key_cache.dtype != value_cache.dtype or not key_cache.is_floating_point():
        raise PagedShapeError(
            "paged_attention: key_cache and value_cache must be float tensors of one dtype, got "
            f"{key_cache.dtype} and {value_cache.dtype}"
        )
    heads, dim = query.shape[1], query.shape[2]
    kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != dim:
        raise PagedShapeError(f"paged_attention: query head_dim {dim} != cache head_dim {key_cache.shape[3]}")
    if kv_heads == 0 or heads % kv_heads:
        raise PagedShapeError(
            f"paged_attention: {heads} query heads are not a multiple of {kv_heads} kv heads"
        )
    for name, t, rank in (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
        if t.dim() != rank or t.dtype != torch.int32:
            raise PagedShapeError(
                f"paged_attention: {name} must be a {rank}-d int32 tensor, got {t.dtype} {tuple(t.shape)}"
            )
    batch = seq_lens.shape[0]
    if (
        block_tables.shape[0] != batch
        or query_start_loc.shape != (batch + 1,)
        or query_start_loc.dtype != torch.int32
    ):
        raise PagedShapeError(
            f"paged_attention: {batch} sequences need block_tables [{batch}, max_blocks] and int32 "
            f"query_start_loc [{batch + 1}], got {tuple(block_tables.shape)} and {tuple(query_start_loc.shape)}"
        )


def reference(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    query_start_loc: Any,
    *,
    scale: float,
) -> Any:
    """Attention of every query token over its sequence's cached positions (see the module
    doc), gathered through the block table, in float32."""
    tokens, heads, dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    batch, max_blocks = block_tables.shape
    span = max_blocks * block_size
    tables = block_tables.long()
    # [batch, span, kv_heads, dim]: each sequence's positions in order
    keys = key_cache[tables].reshape(batch, span, kv_heads, dim).float()
    values = value_cache[tables].reshape(batch, span, kv_heads, dim).float()
    starts = query_start_loc.long()
    rows = torch.arange(tokens, device=query.device)
    seq = torch.searchsorted(starts[1:], rows, right=True).clamp(max=batch - 1)  # [tokens]
    q_len = starts[seq + 1] - starts[seq]
    pos = seq_lens.long()[seq] - q_len + (rows - starts[seq])  # [tokens]
    visible = torch.arange(span, device=query.device)[None, :] <= pos[:, None]  # [tokens, span]
    group = heads // kv_heads
    k = keys[seq].repeat_interleave(group, dim=2)  # [tokens, span, heads, dim]
    v = values[seq].repeat_interleave(group, dim=2)
    scores = torch.einsum("thd,tshd->ths", query.float(), k) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    out = torch.einsum("ths,tshd->thd", torch.softmax(scores, dim=-1), v)
    return out.to(query.dtype)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """``[tokens, heads, head_dim]``: causal GQA attention of a varlen batch over a paged
    cache (see the module doc)."""
    tensors = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    if torch.overrides.has_torch_function(tensors):
        return torch.overrides.handle_torch_function(  # type: ignore[no-any-return]
            paged_attention, tensors, *tensors, scale=scale
        )
    check_paged(*tensors)
    return reference(*tensors, scale=scale)  # type: ignore[no-any-return]


def paged_cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[tokens, kv_heads, head_dim]`` into the caches, token ``t`` at
    slot ``slot_mapping[t]`` (``int64 [tokens]``; see the module doc), in place."""
    # (index_put_ on the cache itself, not index_copy_ on its flattened view: the same write,
    # which a compiled function can make on the caller's cache in place; see the module doc)
    block_size = key_cache.shape[1]
    blocks = slot_mapping // block_size
    offsets = slot_mapping - blocks * block_size
    key_cache.index_put_((blocks, offsets), key.to(key_cache.dtype))
    value_cache.index_put_((blocks, offsets), value.to(value_cache.dtype))


#: what the Graph IR type rule checks, operand by operand: (name, rank, dtype or None: float)
_OPERANDS = (
    ("query", 3, None),
    ("key_cache", 4, None),
    ("value_cache", 4, None),
    ("block_tables", 2, DType.i32),
    ("seq_lens", 1, DType.i32),
    ("query_start_loc", 1, DType.i32),
)


def _infer(ctx: ShapeContext, *operands: Type, scale: float) -> Type:
    """The type rule of ``paged_attention`` (:class:`PagedAttention`): ``tokens``, ``batch``,
    ``num_blocks`` and ``max_blocks`` stay symbols; the operands must fit together as the
    module doc says."""
    if len(operands) != len(_OPERANDS):
        raise ShapeError(f"takes {len(_OPERANDS)} tensors, got {len(operands)}")
    ts = []
    for (name, rank, dtype), t in zip(_OPERANDS, operands):
        tt = tensor_of(t, name)
        ok = tt.dtype == dtype if dtype is not None else tt.dtype.is_floating
        if tt.rank != rank or not ok:
            want = str(dtype.torch).removeprefix("torch.") if dtype is not None else "float"
            raise ShapeError(
                f"{name} must be a {rank}-d {want} tensor, got {tt}",
                hint="see the layout in cuvil_ir/graph_ir/ops/paged.py (docs/paged-attention.md)",
            )
        ts.append(tt)
    q, kc, vc, tables, seq_lens, starts = ts
    if kc.dtype != vc.dtype:
        raise ShapeError(
            f"key_cache and value_cache must have one dtype, got {kc.dtype.value} and {vc.dtype.value}"
        )
    for i, what in enumerate(("num_blocks", "block_size", "kv_heads", "head_dim")):
        check_equal(ctx, kc.shape[i], vc.shape[i], f"key_cache and value_cache {what}")
    check_equal(ctx, q.shape[2], kc.shape[3], "query head_dim and the cache's head_dim")
    check_divisible(ctx, q.shape[1], kc.shape[2], "query heads, by kv heads (grouped-query attention)")
    check_equal(ctx, tables.shape[0], seq_lens.shape[0], "block_tables rows and seq_lens")
    check_equal(ctx, starts.shape[0], seq_lens.shape[0] + 1, "query_start_loc size and batch + 1")
    return TensorType(q.dtype, q.shape, device_of(*ts))


class PagedAttention(Op):
    """Causal grouped-query attention of a varlen batch over a paged KV cache; inputs
    ``query, key_cache, value_cache, block_tables, seq_lens, query_start_loc``, attribute
    ``scale`` (see the module doc)."""

    name = "paged_attention"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {
        "tensor_ir": "attention gathered through block tables, with per-sequence lengths read from "
        "tensors: one kernel call (the cpu target's cuvil_backend_cpu/paged_attention.c, the Triton "
        "kernel on cuda and ascend), not a loop nest",
        "mlir": "the block-table gather and the per-sequence causal bounds come from tensor data; no "
        "linalg form here yet (the reference gathers, then runs a masked softmax)",
        "onnx": "not exported yet (ONNX has no paged attention; com.microsoft's PagedAttention of "
        "onnxruntime-genai would carry it)",
    }

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (paged_attention,)

    @staticmethod
    def capture(
        b: Emitter,
        query: Any,
        key_cache: Any,
        value_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        query_start_loc: Any,
        *,
        scale: float,
    ) -> Any:
        return b.emit(
            "paged_attention",
            [query, key_cache, value_cache, block_tables, seq_lens, query_start_loc],
            scale=float(scale),
        )

    @staticmethod
    def infer(
        ctx: ShapeContext,
        query: Type,
        key_cache: Type,
        value_cache: Type,
        block_tables: Type,
        seq_lens: Type,
        query_start_loc: Type,
        *,
        scale: float,
    ) -> Type:
        return _infer(
            ctx, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=scale
        )

    @staticmethod
    def reference(
        query: Any,
        key_cache: Any,
        value_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        query_start_loc: Any,
        *,
        scale: float,
    ) -> Any:
        return reference(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=scale)


__all__ = [
    "BLOCK_SIZES",
    "PagedAttention",
    "PagedShapeError",
    "check_paged",
    "paged_attention",
    "paged_cache_write",
    "reference",
]
