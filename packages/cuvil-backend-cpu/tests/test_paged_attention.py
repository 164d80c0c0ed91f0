"""The ``cpu`` target's paged attention kernel (``paged_attention.c``) against attention computed in
float64 position by position (:mod:`cuvil.testing.paged`): head sizes off every vector width,
grouped-query heads, block sizes 16 and 32, mixed batches of prefill chunks and decode steps,
blocks out of order and shared between sequences, long-context decode split along the sequence,
float32/bfloat16/float16 caches, every vector width (the host's, and 16, 8 and 4 lanes forced in
plain vector arithmetic); then through ``cu.compile`` with ``fallback="error"``: the cache write
in place, one compile for every batch size, and clear errors. ``nox -s tests_isa`` runs this file
with ``CUVIL_CPU_ISA=avx2`` and ``portable`` too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.testing.paged import MIXED, expected, make_batch, slot_mapping
from cuvil_backend_cpu import paged_attention as pa_module
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.paged_attention import PagedAttentionKernel
from cuvil_ir.graph_ir.ops.paged import PagedShapeError, paged_attention, paged_cache_write, reference


@pytest.fixture(scope="module", params=[None, 16, 8, 4], ids=["host", "lanes16", "lanes8", "lanes4"])
def pa(request: pytest.FixtureRequest) -> PagedAttentionKernel:
    """The host's kernel, and kernels with 16, 8 and 4 lanes forced."""
    if request.param is None:
        return pa_module.kernel(KernelCache())
    return PagedAttentionKernel(KernelCache(), lanes=request.param)


def _check(pa: PagedAttentionKernel, batch: Any, atol: float = 2e-5, **kw: Any) -> torch.Tensor:
    got = pa(*batch.operands(), scale=batch.scale, **kw)
    want = expected(batch)
    assert got.dtype == batch.query.dtype and got.shape == batch.query.shape
    torch.testing.assert_close(got.double(), want, rtol=atol, atol=atol)
    return got


@pytest.mark.parametrize("head_dim", [24, 40, 64, 80, 128])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_mixed_batch(pa: PagedAttentionKernel, head_dim: int, group: int, block_size: int) -> None:
    batch = make_batch(
        [(40, 1), (17, 5), (70, 1), (3, 3)],
        heads=2 * group,
        kv_heads=2,
        head_dim=head_dim,
        block_size=block_size,
        seed=head_dim + group,
    )
    _check(pa, batch)


@pytest.mark.parametrize("seqs", MIXED, ids=str)
@pytest.mark.parametrize("query_tile", [1, 3, 8])
def test_tiles_of_query_tokens(
    pa: PagedAttentionKernel, seqs: list[tuple[int, int]], query_tile: int
) -> None:
    _check(pa, make_batch(seqs, heads=8, kv_heads=2, head_dim=24), query_tile=query_tile, threads=3)


@pytest.mark.parametrize("head_dim", [18, 40])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("query_tile", [1, 2, 3])
@pytest.mark.parametrize("block_size", [7, 16])
def test_packed_and_column_rows(
    pa: PagedAttentionKernel, head_dim: int, group: int, query_tile: int, block_size: int
) -> None:
    """Both layouts of an item's rows (query tokens x group) at every width: up to half a vector of
    rows packed several keys to a vector (1, 2, 4 and, at 16 lanes, 8 rows; causal rows inside one
    vector when a tile has several tokens), more rows one per lane down the keys; head sizes that
    are no whole number of vectors (18: 5, 3 and 2 vectors of 4, 8 and 16 lanes, read through the
    zero-padded row buffers; 40: 3 vectors of 16) and an odd vector count for the values' tiles.
    Blocks of 7 cut sub-tiles at odd key counts: the packed layout's last vector is partly past
    the sub-tile's keys."""
    batch = make_batch(
        [(37, 1), (50, 3), (5, 2), (18, 1)],
        heads=2 * group,
        kv_heads=2,
        head_dim=head_dim,
        block_size=block_size,
        seed=group + query_tile,
    )
    _check(pa, batch, query_tile=query_tile, threads=2)


def test_shared_prefix_blocks(pa: PagedAttentionKernel) -> None:
    """Two sequences reading the same first blocks (a common prompt), then their own."""
    batch = make_batch([(40, 1), (35, 3), (33, 1)], shared_prefix_blocks=2, heads=4, kv_heads=1)
    t = batch.block_tables
    assert torch.equal(t[0, :2], t[1, :2]) and torch.equal(t[0, :2], t[2, :2])
    _check(pa, batch, threads=4)


@pytest.mark.parametrize("seq_len", [600, 257, 33])
@pytest.mark.parametrize("threads", [4, 16])
def test_long_context_decode_is_split_along_the_sequence(
    pa: PagedAttentionKernel, seq_len: int, threads: int
) -> None:
    batch = make_batch([(seq_len, 1)], heads=8, kv_heads=2, head_dim=40, block_size=16, seed=seq_len)
    _check(pa, batch, threads=threads, split_min=16)
    assert pa.last_split_items > 2, "the decode step was not split"
    _check(pa, batch, threads=1, split_min=16)
    assert pa.last_split_items == 0, "one thread needs no split"


def test_decode_split_with_the_default_chunk(pa: PagedAttentionKernel) -> None:
    batch = make_batch([(2000, 1), (900, 1)], heads=4, kv_heads=1, head_dim=64, block_size=32)
    _check(pa, batch, threads=8)
    assert pa.last_split_items > 0


def test_prefill_chunk_split_with_rows_that_miss_a_chunk(pa: PagedAttentionKernel) -> None:
    """A chunk of 9 queries split along 300 positions: the early rows see none of the last chunk."""
    batch = make_batch([(300, 9)], heads=4, kv_heads=2, head_dim=24)
    _check(pa, batch, threads=8, split_min=16, query_tile=9)
    assert pa.last_split_items > 0


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_half_caches(pa: PagedAttentionKernel, cache_dtype: torch.dtype) -> None:
    batch = make_batch([(40, 1), (17, 5)], cache_dtype=cache_dtype, head_dim=40, seed=3)
    _check(pa, batch, threads=2)
    _check(pa, batch, threads=8, split_min=16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_queries_round_once_like_the_reference(pa: PagedAttentionKernel, dtype: torch.dtype) -> None:
    batch = make_batch([(40, 1), (17, 5)], dtype=dtype, head_dim=24, seed=4)
    got = pa(*batch.operands(), scale=batch.scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got, reference(*batch.operands(), scale=batch.scale), rtol=1e-2, atol=1e-2)


def test_strided_query_and_empty_sequences(pa: PagedAttentionKernel) -> None:
    batch = make_batch([(40, 1), (9, 0), (17, 5)], head_dim=24)
    batch.query = torch.randn(6, 4, 48)[:, :, ::2]  # a query strided along head_dim
    _check(pa, batch)
    empty = make_batch([], head_dim=24)
    assert pa(*empty.operands(), scale=1.0).shape == (0, 4, 24)


def test_bad_batches_are_clear_errors(pa: PagedAttentionKernel) -> None:
    batch = make_batch([(40, 1), (17, 5)])
    ops = list(batch.operands())
    bad = dict(
        starts=(5, torch.tensor([0, 3, 5], dtype=torch.int32), "query_start_loc must rise from 0"),
        short=(4, torch.tensor([40, 4], dtype=torch.int32), "sequence 1 has length 4"),
        long=(4, torch.tensor([400, 17], dtype=torch.int32), "sequence 0 has length 400"),
        falls=(5, torch.tensor([0, 7, 6], dtype=torch.int32), "at sequence 1 it is 6"),
    )
    for i, t, message in bad.values():
        args = list(ops)
        args[i] = t
        with pytest.raises(PagedShapeError, match=message):
            pa(*args, scale=1.0)
    tables = batch.block_tables.clone()
    tables[1, 0] = 999
    with pytest.raises(PagedShapeError, match="sequence 1 uses block 999"):
        pa(*ops[:3], tables, *ops[4:], scale=1.0)
    with pytest.raises(PagedShapeError, match="not a multiple of"):
        pa(torch.randn(6, 3, 16), *ops[1:], scale=1.0)


# -- through cu.compile ---------------------------------------------------------------------------
def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    starts: torch.Tensor,
) -> torch.Tensor:
    """A layer's step as the serving engine runs it: write the step's keys, attend."""
    paged_cache_write(k, v, key_cache, value_cache, slots)
    return paged_attention(q, key_cache, value_cache, tables, seq_lens, starts, scale=0.25)


def _step_args(seqs: list[tuple[int, int]], seed: int, **kw: Any) -> tuple[Any, ...]:
    batch = make_batch(seqs, seed=seed, **kw)
    tokens, kv_heads, dim = batch.query.shape[0], batch.key_cache.shape[2], batch.key_cache.shape[3]
    g = torch.Generator().manual_seed(seed + 1)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=g) for _ in range(2))
    return (batch.query, k, v, batch.key_cache, batch.value_cache, slot_mapping(batch), *batch.operands()[3:])


class _Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = PagedAttentionKernel.__call__

        def call(kernel: PagedAttentionKernel, *a: Any, **kw: Any) -> torch.Tensor:
            self.calls += 1
            return real(kernel, *a, **kw)

        monkeypatch.setattr(PagedAttentionKernel, "__call__", call)


@torch.no_grad()
def test_compiled_step_writes_the_caches_in_place_and_runs_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = cu.compile(step, target="cpu", fallback="error")
    spy = _Spy(monkeypatch)
    # batch, tokens, blocks and max_blocks all change: one compile
    batches = [[(40, 1), (17, 5), (3, 3)], [(1, 1)], [(70, 1), (33, 12)], *MIXED[2:]]
    for i, seqs in enumerate(batches):
        args = _step_args(seqs, seed=i, heads=4, kv_heads=2, head_dim=24, block_size=16 if i % 2 else 32)
        eager_caches = (args[3].clone(), args[4].clone())
        want = step(*args[:3], *eager_caches, *args[5:])
        ptrs = (args[3].data_ptr(), args[4].data_ptr())
        got = f(*args)
        assert (args[3].data_ptr(), args[4].data_ptr()) == ptrs
        torch.testing.assert_close(args[3], eager_caches[0], rtol=0, atol=0)
        torch.testing.assert_close(args[4], eager_caches[1], rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert spy.calls == len(batches), "the cpu target did not run its kernel"
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0, f.stats.recompile_reasons
    graph = str(f.graphs[0])
    assert graph.count("in_place = true") == 2, "the cache writes clone the caches"
    assert "paged_attention(" in f.artifacts[-1].executable.stages["tensor_ir"]


@torch.no_grad()
def test_compiled_cache_write_makes_no_copy_of_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    f = cu.compile(step, target="cpu", fallback="error")
    args = _step_args([(40, 1), (17, 5)], seed=7)
    f(*args)
    seen: list[int] = []
    real = torch.Tensor.clone
    ptrs = {args[3].untyped_storage().data_ptr(), args[4].untyped_storage().data_ptr()}

    def clone(self: torch.Tensor, *a: Any, **kw: Any) -> torch.Tensor:
        if self.untyped_storage().data_ptr() in ptrs:
            seen.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "clone", clone)
    f(*args)
    monkeypatch.undo()
    assert not seen, "a cache was cloned"


@torch.no_grad()
def test_compiled_half_cache_with_half_queries() -> None:
    f = cu.compile(step, target="cpu", fallback="error")
    args = list(_step_args([(40, 1), (17, 5)], seed=9, cache_dtype=torch.bfloat16))
    args[0] = args[0].to(torch.bfloat16)
    eager_caches = (args[3].clone(), args[4].clone())
    want = step(*args[:3], *eager_caches, *args[5:])
    got = f(*args)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(args[3], eager_caches[0], rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_compiled_bad_operands_are_clear_errors() -> None:
    f = cu.compile(step, target="cpu", fallback="error")
    args = list(_step_args([(40, 1), (17, 5)], seed=5))
    bad = list(args)
    bad[6] = args[6].long()  # int64 block tables
    with pytest.raises(Exception, match="block_tables must be a 2-d int32"):
        f(*bad)
    bad = list(args)
    bad[8] = torch.tensor([0, 6], dtype=torch.int32)  # query_start_loc of the wrong size
    with pytest.raises(Exception, match="query_start_loc"):
        f(*bad)
    bad = list(args)
    bad[7] = torch.tensor([40, 3], dtype=torch.int32)  # a sequence shorter than its queries
    with pytest.raises(PagedShapeError, match="sequence 1 has length 3"):
        f(*bad)


def test_a_contiguous_cache_is_one_block_per_sequence(pa: PagedAttentionKernel) -> None:
    """Issue 29's decode attention over transformers' contiguous ``[batch, kv_heads, S, D]``
    cache: the cache as one block of S positions per sequence (a transposed view, read in
    place through its strides) and the identity block table."""
    from cuvil.testing.paged import PagedBatch

    g = torch.Generator().manual_seed(11)
    keys, values = (torch.randn(3, 2, 50, 24, generator=g) for _ in range(2))
    lens = torch.tensor([50, 37, 1], dtype=torch.int32)
    batch = PagedBatch(
        torch.randn(3, 4, 24, generator=g),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        torch.arange(3, dtype=torch.int32)[:, None],
        lens,
        torch.arange(4, dtype=torch.int32),
        0.2,
    )
    assert not batch.key_cache.is_contiguous()
    _check(pa, batch, threads=8, split_min=16)
    assert pa.last_split_items > 0


@torch.no_grad()
def test_saved_and_loaded_program_runs_the_kernel(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded artifact (``CpuHooks.extern``) builds the kernel with this host's compiler and
    serves other batch sizes."""

    def attend(q, kc, vc, tables, lens, starts):  # type: ignore[no-untyped-def]
        return paged_attention(q, kc, vc, tables, lens, starts, scale=0.25) * 2

    path = cu.save(attend, tmp_path / "paged.cuvil", *make_batch([(40, 1), (17, 5)]).operands())
    loaded = cu.load(path)
    spy = _Spy(monkeypatch)
    other = make_batch([(70, 1), (17, 5), (3, 3)], seed=3)
    torch.testing.assert_close(loaded(*other.operands()), attend(*other.operands()), rtol=1e-5, atol=1e-5)
    assert spy.calls == 1
