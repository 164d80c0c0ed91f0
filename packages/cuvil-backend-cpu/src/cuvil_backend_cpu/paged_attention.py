"""``paged_attention`` (cuvil_ir/graph_ir/ops/paged.py) as the ``cpu`` target's own kernel.

``paged_attention.c`` is written once (not generated) and built by the target's kernel cache like
any generated kernel (same compiler, flags and ISA: ``CUVIL_CPU_ISA`` picks the AVX-512, AVX2 or
portable code). Float32 math throughout: a float32, bfloat16 or float16 cache is read as it is
stored and widened row by row; a query that is not float32 is widened here and the result
rounded once to its dtype, as the op's reference does (docs/paged-attention.md).

:func:`extern` is what a ``paged_attention`` extern call runs on the ``cpu`` target: the kernel
on CPU tensors it takes, else the op's reference. A batch the kernel refuses (query_start_loc not
rising from 0 to the token count, a sequence longer than its block table or shorter than its
queries, a block number outside the cache) is a :class:`~cuvil_ir.graph_ir.ops.paged.PagedShapeError`
naming the sequence.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cpu.c_prelude import build_facts, kernel_source
from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache
from cuvil_backend_cpu.toolchain import ToolchainError
from cuvil_ir.graph_ir.ops import paged

#: the kernel's source, the vector prelude in place (:mod:`cuvil_backend_cpu.c_prelude`)
SOURCE = kernel_source("paged_attention.c")

#: the Graph IR op this module runs
OP = paged.PagedAttention.name

#: the caches' dtypes the kernel reads, and their codes in ``paged_attention.c``
CACHE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: query tokens of one sequence per work item: a prefill chunk's tokens share each K/V row read
QUERY_TILE = 8
#: a decode tile is split along its sequence only where it sees at least twice this many
#: positions (a chunk shorter than this costs more in the reduction than it saves)
SPLIT_MIN = 256

_ERRORS = {
    2: "query_start_loc must rise from 0 to the number of query tokens ({tokens}); at sequence {seq} "
    "it is {value}",
    3: "sequence {seq} has length {value}, which is below its query tokens or above its block table's "
    "max_blocks x block_size = {span}",
    4: "sequence {seq} uses block {value}, outside the cache's {blocks} blocks",
}


class PagedAttentionKernel:
    """The compiled kernel of ``paged_attention.c``, loaded from ``cache``."""

    def __init__(self, cache: KernelCache, lanes: int | None = None) -> None:
        """``lanes`` forces the vector width (tests: the AVX-512 width on any host)."""
        source = kernel_source("paged_attention.c", lanes)
        lib = cache.load(cache.build(source, name="paged_attention"), source, name="paged_attention")
        self._fn = lib.cuvil_paged_attention
        self._fn.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_char_p, ctypes.c_float, ctypes.c_void_p]
        self._fn.restype = ctypes.c_int
        #: an emulated kernel (:mod:`cuvil_backend_cpu.emulation`) takes tensors, not addresses
        self._tensors = isinstance(lib, EmulatedLibrary)
        #: the build's vector width (floats) and positions per sub-tile
        self.lanes, self.positions = build_facts(lib, "cuvil_paged_attention_info", 2)
        #: split items of the last call (tests: the long-context split happened)
        self.last_split_items = 0
        self._decode = lib.cuvil_decode_attention
        self._decode.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_char_p, ctypes.c_float, ctypes.c_float]
        self._decode.restype = ctypes.c_int
        #: the same as a native run's step (integer arguments only), or None under emulation
        self.decode_step: int | None = None
        if not self._tensors:
            self.decode_step = ctypes.cast(lib.cuvil_decode_attention_step, ctypes.c_void_p).value  # type: ignore[arg-type]

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        scale: float,
        drop: float,
        threads: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A decode step's attention over a contiguous cache (``cuvil_decode_attention``):
        float32 ``q [B, H, 1, D]``, ``k, v [B, KVH, S, D]`` with a unit stride along ``D``,
        ``mask`` None or ``[B or 1, 1, 1, S]`` bool/float32 with a unit stride along ``S``
        (:mod:`cuvil_backend_cpu.decode_attention` checks all this). A mask that allows a prefix
        of positions per sequence (values at or below ``drop`` drop a position) runs the split
        kernel, any other the direct form (torch's semantics: a row that sees nothing is zeros).
        ``out``: a contiguous float32 ``[B, H, 1, D]`` to write (else a new one)."""
        batch, heads, _, dim = q.shape
        positions = k.shape[2]
        if out is None:
            out = torch.empty((batch, heads, 1, dim), dtype=torch.float32)
        block = decode_params(
            q.shape, q.stride(), k.shape, k.stride(), v.stride(),
            None if mask is None else (mask.dtype, mask.shape, mask.stride()),
            max(1, torch.get_num_threads() if threads is None else threads),
        )  # fmt: skip
        params = struct.pack("18q", *block)
        tensors = (q, k, v, mask, out)
        ptrs = tensors if self._tensors else tuple(None if t is None else t.data_ptr() for t in tensors)
        rc = self._decode(*ptrs, params, float(scale), float(drop))
        if rc == 1:
            raise MemoryError(f"decode attention of {batch} sequences x {positions} positions: out of memory")
        if rc:
            raise ValueError(
                f"decode attention: the kernel refused {tuple(q.shape)} x {tuple(k.shape)} ({rc})"
            )
        return out

    @staticmethod
    def takes(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
        """Whether the kernel runs these operands (the rest runs the reference)."""
        return (
            query.device.type == key_cache.device.type == value_cache.device.type == "cpu"
            and query.is_floating_point()
            and key_cache.dtype == value_cache.dtype
            and key_cache.dtype in CACHE_DTYPES
            and query.dim() == 3
            and key_cache.dim() == 4
        )

    def __call__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        *,
        scale: float,
        threads: int | None = None,
        split_min: int = SPLIT_MIN,
        query_tile: int = QUERY_TILE,
    ) -> torch.Tensor:
        """``paged_attention(...)`` by the kernel (operands the op's checks accepted and
        :meth:`takes`); ``threads``, ``split_min`` and ``query_tile`` override the defaults
        (tests: the split and the tiling on any machine)."""
        paged.check_paged(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
        tokens, heads, dim = query.shape
        num_blocks, block_size, kv_heads, _ = key_cache.shape
        batch, max_blocks = block_tables.shape
        q = query if query.dtype == torch.float32 else query.float()
        if q.stride(-1) != 1 and dim > 1:
            q = q.contiguous()
        kc, vc = _unit_last(key_cache), _unit_last(value_cache)
        tables, lens, starts = (t.contiguous() for t in (block_tables, seq_lens, query_start_loc))
        out = torch.empty((tokens, heads, dim), dtype=torch.float32)
        # (a ctypes pair, not a tensor, for the compiled kernel: a few microseconds of a decode step)
        info: Any = torch.zeros(2, dtype=torch.int64) if self._tensors else (ctypes.c_int64 * 2)()
        params = struct.pack(
            "20q",
            tokens, heads, kv_heads, dim, batch, max_blocks, block_size, num_blocks,
            q.stride(0), q.stride(1), *kc.stride()[:3], *vc.stride()[:3],
            CACHE_DTYPES[kc.dtype],
            max(1, torch.get_num_threads() if threads is None else threads),
            max(1, split_min), max(1, query_tile),
        )  # fmt: skip
        tensors = (q, kc, vc, tables, lens, starts, out)
        ptrs = tensors if self._tensors else tuple(t.data_ptr() for t in tensors)
        rc = self._fn(*ptrs, params, float(scale), info if self._tensors else ctypes.addressof(info))
        if rc == 1:
            raise MemoryError(f"paged_attention of {tokens} tokens over {batch} sequences: out of memory")
        if rc:
            seq, value = (int(x) for x in info)
            message = _ERRORS[rc].format(
                seq=seq, value=value, tokens=tokens, span=max_blocks * block_size, blocks=num_blocks
            )
            raise paged.PagedShapeError(f"paged_attention: {message}")
        self.last_split_items = int(info[1])
        return out if query.dtype == torch.float32 else out.to(query.dtype)


def decode_params(
    q_shape: tuple[int, ...],
    q_strides: tuple[int, ...],
    k_shape: tuple[int, ...],
    k_strides: tuple[int, ...],
    v_strides: tuple[int, ...],
    mask: tuple[torch.dtype, tuple[int, ...], tuple[int, ...]] | None,
    threads: Any,
) -> tuple[Any, ...]:
    """``cuvil_decode_attention``'s 18 parameters (its ``D_*`` order) for these operands (the
    mask: its dtype, shape and strides); ``threads`` goes in as given (a native run's step puts
    its per-call thread count there)."""
    batch, heads, _, dim = q_shape
    kv_heads, positions = k_shape[1], k_shape[2]
    kind = 0 if mask is None else 1 if mask[0] == torch.bool else 2
    mask_b = 0 if mask is None or mask[1][0] == 1 else mask[2][0]
    return (
        batch, heads, kv_heads, dim, positions, q_strides[0], q_strides[1], *k_strides[:3],
        *v_strides[:3], kind, mask_b, threads, SPLIT_MIN, QUERY_TILE,
    )  # fmt: skip


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def kernel(cache: KernelCache) -> PagedAttentionKernel:
    """The kernel built and loaded from ``cache``, once per cache."""
    return per_cache(PagedAttentionKernel, cache)


def extern(cache: KernelCache | None, reference: Callable[..., Any]) -> Callable[..., Any]:
    """What a ``paged_attention`` extern call runs: the kernel where it takes the operands, else
    ``reference``. ``cache=None`` (a loaded artifact) builds the kernel with this host's compiler
    if it has one, else runs the reference."""
    pa: PagedAttentionKernel | None = None
    if cache is None:
        try:
            cache = KernelCache()
        except ToolchainError:
            cache = None
    if cache is not None:
        pa = kernel(cache)

    def run(
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        *,
        scale: float,
    ) -> torch.Tensor:
        operands = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
        if pa is None or not pa.takes(query, key_cache, value_cache):
            return reference(*operands, scale=scale)  # type: ignore[no-any-return]
        return pa(*operands, scale=scale)

    return run


__all__ = [
    "CACHE_DTYPES",
    "OP",
    "QUERY_TILE",
    "SPLIT_MIN",
    "PagedAttentionKernel",
    "extern",
    "kernel",
]
