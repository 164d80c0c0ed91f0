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

A mask that is not such a prefix runs the C call's direct form (``decode_any_mask``: per
sequence and head, scores, softmax and sum in one pass, torch's semantics for a row that sees
nothing), so the C call takes every mask of that shape.

**In the program** (:func:`rewrite`, a Graph IR pass of the ``cpu`` target): an ``sdpa`` whose
query has one position (1, or a size the graph assumes 1), float32 4-d operands, no causal flag
and a 4-d boolean or float32 mask (or none; its sizes are checked per call) becomes
``cpu_decode_attention``, an op written into its
planned buffer (:func:`out_variant`: the C call, or torch's attention copied in where it does
not apply), whose C form (:func:`native`, ``cuvil_decode_attention_step``) is a step of a
native run ([Note: native runs] in cuvil_runtime/native_runs.py): a decode step's attention no
longer returns to Python between its layers' runs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from cuvil_backend_cpu.epilogues import context
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.paged_attention import PagedAttentionKernel, decode_params, kernel
from cuvil_ir import REGISTRY
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.ops._rules import LIBRARY_KERNEL
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext
from cuvil_runtime.target import NativeArg, NativeExtern, NativeOperand

#: cached positions (batch x positions) from which a decode step's attention runs the kernel
#: (measured, above)
MIN_CACHED = 64
#: an additive mask value at or below this drops its position exactly (``exp`` underflows to 0)
DROPPED = torch.finfo(torch.float32).min / 2


def takes(
    q: Sequence[int],
    k: Sequence[int],
    v: Sequence[int],
    mask: tuple[torch.dtype, Sequence[int]] | None,
    enable_gqa: bool,
) -> bool:
    """Whether the C call takes operands of these shapes (the mask: its dtype and shape):
    ``q [B, H, 1, D]``, ``k, v [B, KVH, S, D]`` with ``S >= 1`` and ``H`` a multiple of ``KVH``
    (equal without ``enable_gqa``), a bool or float32 mask ``[B or 1, 1, 1, S]`` or none."""
    if not (len(q) == len(k) == len(v) == 4 and q[2] == 1):
        return False
    batch, heads, _, dim = q
    kv_heads, positions = k[1], k[2]
    if (
        positions < 1
        or tuple(k) != tuple(v)
        or k[0] != batch
        or k[3] != dim
        or kv_heads < 1
        or heads % kv_heads
        or (heads != kv_heads and not enable_gqa)
    ):
        return False
    if mask is None:
        return True
    dtype, shape = mask  # (per-head or per-query masks, or a broadcast along the positions: no)
    return (
        dtype in (torch.bool, torch.float32)
        and len(shape) == 4
        and tuple(shape[1:]) == (1, 1, positions)
        and shape[0] in (1, batch)
    )


def attend(
    kernel: Callable[[], PagedAttentionKernel],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float,
    enable_gqa: bool,
    out: torch.Tensor | None = None,
    min_cached: int | None = None,
) -> torch.Tensor | None:
    """``sdpa(q, k, v, mask, scale=scale, enable_gqa=...)`` for a decode step (see the
    module doc) by the kernel ``kernel()`` returns (built at the first step that uses it),
    or ``None`` where it does not apply (fewer than ``min_cached`` cached positions, by
    default :data:`MIN_CACHED`); into ``out`` (contiguous ``[B, H, 1, D]``) if given."""
    if not (
        q.dtype == k.dtype == v.dtype == torch.float32
        and q.device.type == k.device.type == v.device.type == "cpu"
        and (mask is None or mask.device.type == "cpu")
        and takes(q.shape, k.shape, v.shape, None if mask is None else (mask.dtype, mask.shape), enable_gqa)
    ):
        return None
    batch, heads, _, dim = q.shape
    positions = k.shape[2]
    if batch * positions < (MIN_CACHED if min_cached is None else min_cached):
        return None
    if mask is not None and mask.stride(3) != 1 and positions > 1:
        mask = mask.contiguous()
    if out is not None and not (
        out.dtype == torch.float32 and out.shape == (batch, heads, 1, dim) and out.is_contiguous()
    ):
        return None
    q, k, v = (t if t.stride(3) == 1 or dim <= 1 else t.contiguous() for t in (q, k, v))
    return kernel().decode(q, k, v, mask, scale=scale, drop=DROPPED, out=out)


# -- in the program: the op, its rewrite, its out-variant and its C form -----------------------

_INTERNAL = (
    "an op of the cpu target's own graph rewrite (cuvil_backend_cpu.decode_attention), made "
    "after capture and never in a captured or exported graph"
)


class DecodeAttention(Op):
    """``sdpa(q, k, v[, mask], scale=scale, enable_gqa=...)`` of a decode step (one query
    position), written into its planned buffer; inputs and attributes as ``sdpa``'s, the scale
    given (never ``None``), never causal."""

    name = "cpu_decode_attention"
    traits = frozenset({"extern_kernel", "pure"})
    extern_reasons = {"tensor_ir": LIBRARY_KERNEL, "mlir": _INTERNAL, "onnx": _INTERNAL}

    @staticmethod
    def infer(
        ctx: ShapeContext,
        q: Type,
        k: Type,
        v: Type,
        *mask: Type,
        scale: float,
        enable_gqa: bool,
        has_mask: bool,
    ) -> Type:
        sdpa = REGISTRY.get("sdpa")
        return sdpa.infer(  # type: ignore[no-any-return,return-value]
            ctx, q, k, v, *mask, is_causal=False, scale=scale, enable_gqa=enable_gqa, has_mask=has_mask
        )

    @staticmethod
    def reference(q: Any, k: Any, v: Any, *mask: Any, scale: float, enable_gqa: bool, has_mask: bool) -> Any:
        sdpa = REGISTRY.get("sdpa")
        return sdpa.reference(
            q, k, v, *mask, is_causal=False, scale=scale, enable_gqa=enable_gqa, has_mask=has_mask
        )


OP = DecodeAttention.name


def _f32(t: Type) -> TensorType | None:
    return (
        t
        if isinstance(t, TensorType) and t.rank == 4 and t.dtype == DType.f32 and t.device == "cpu"
        else None
    )


def rewrite(graph: Graph) -> Graph:
    """``graph`` with each top-level ``sdpa`` of a decode step's shape (the module doc) made a
    ``cpu_decode_attention``; the graph itself when there is none. Deterministic."""
    if not any(n.op == "sdpa" for n in graph.nodes):
        return graph
    ctx = context(graph)

    def one(d: Any) -> bool:  # (a decode step's query length is a symbol the graph assumes 1)
        return d == 1 or bool(ctx.prove(sympy.Eq(d, 1)))

    nodes = list(graph.nodes)
    changed = False
    for i, n in enumerate(nodes):
        if n.op != "sdpa" or n.attr("is_causal"):
            continue
        q, k, v = (_f32(x.type) for x in n.inputs[:3])
        if q is None or k is None or v is None or not one(q.shape[2]):
            continue
        has_mask = bool(n.attr("has_mask"))
        if has_mask:  # (its sizes are checked per call: others run torch's attention)
            m = n.inputs[3].type
            if not (isinstance(m, TensorType) and m.rank == 4 and m.dtype in (DType.f32, DType.bool)):
                continue
        scale: Any = n.attr("scale")
        if scale is None:
            dim = q.shape[3]
            if not (isinstance(dim, int) or getattr(dim, "is_Integer", False)) or int(dim) < 1:
                continue
            scale = 1.0 / math.sqrt(int(dim))
        attrs = (("enable_gqa", bool(n.attr("enable_gqa"))), ("has_mask", has_mask), ("scale", float(scale)))
        nodes[i] = n.replace(op=OP, attrs=attrs)
        changed = True
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def out_variant(cache: KernelCache | None) -> Callable[..., None]:
    """What a ``cpu_decode_attention`` call runs: ``(out, q, k, v[, mask], **attrs)`` writing
    ``out``, by the C call (built by ``cache``) where :func:`attend` takes the operands, else
    torch's attention copied in (also with no ``cache``: a loaded artifact on a host without a
    C compiler)."""

    def run(
        out: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *mask: torch.Tensor,
        scale: float,
        enable_gqa: bool,
        has_mask: bool,
    ) -> None:
        if cache is not None:
            m = mask[0] if has_mask else None
            # (at any cache length: what the native step computes, bit for bit)
            got = attend(
                lambda: kernel(cache), q, k, v, m, scale=scale, enable_gqa=enable_gqa, out=out, min_cached=0
            )
            if got is not None:
                return
        out.copy_(
            DecodeAttention.reference(q, k, v, *mask, scale=scale, enable_gqa=enable_gqa, has_mask=has_mask)
        )

    return run


def _bits(x: float) -> int:
    """The float32 bit pattern of ``x`` (the C step reads its scale from an integer)."""
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def native(pa: PagedAttentionKernel) -> NativeExtern | None:
    """The C call as a step of a native run (``cuvil_decode_attention_step``): the operands
    :func:`attend` passes to the kernel without a copy (float32, a unit stride along the head
    dim and the mask's positions, ``out`` contiguous), at any cache length; others run
    :func:`out_variant`."""
    if pa.decode_step is None:
        return None
    threads = object()

    def prepare(ops: Sequence[NativeOperand], attrs: Mapping[str, Any]) -> list[NativeArg] | None:
        if len(ops) != 4 + int(bool(attrs["has_mask"])):
            return None
        out, q, k, v, *mask = ops
        m = mask[0] if mask else None
        if any(t.dtype != torch.float32 for t in (out, q, k, v)) or not takes(
            q.shape, k.shape, v.shape, None if m is None else (m.dtype, m.shape), bool(attrs["enable_gqa"])
        ):
            return None
        batch, heads, _, dim = q.shape
        if (
            out.shape != (batch, heads, 1, dim)
            or not out.is_contiguous()
            or (dim > 1 and any(t.strides[3] != 1 for t in (q, k, v)))  # (attend copies these)
            or (m is not None and k.shape[2] > 1 and m.strides[3] != 1)
        ):
            return None
        meta = None if m is None else (m.dtype, m.shape, m.strides)
        block = decode_params(q.shape, q.strides, k.shape, k.strides, v.strides, meta, threads)
        entries = tuple(("threads",) if x is threads else ("int", int(x)) for x in block)
        entries += (("int", _bits(float(attrs["scale"]))), ("int", _bits(DROPPED)))
        return [
            ("ptr", 1),
            ("ptr", 2),
            ("ptr", 3),
            ("ptr", 4) if m is not None else ("int", 0),
            ("ptr", 0),
            ("block", entries),
        ]

    def error(rc: int, attrs: Mapping[str, Any]) -> Exception:
        if rc == 1:
            return MemoryError("decode attention: out of memory")
        return ValueError(f"decode attention: the kernel refused its operands ({rc})")

    return NativeExtern(pa.decode_step, prepare, error)


__all__ = [
    "DROPPED",
    "MIN_CACHED",
    "OP",
    "DecodeAttention",
    "attend",
    "native",
    "out_variant",
    "rewrite",
    "takes",
]
