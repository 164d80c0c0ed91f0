"""The ``cuda`` target's paged attention (the Triton kernel of
``cuvil_runtime/triton_kernels/paged_attention.py``) in Triton's interpreter, against attention
computed in float64 position by position (:mod:`cuvil.testing.paged`): head sizes off the
powers of two, grouped-query heads, block sizes 16 and 32, mixed prefill/decode batches, blocks
out of order and shared, float32/bfloat16/float16; through ``cu.compile`` with one compile for
every batch size; and the kernel compiled ahead of time to PTX for sm_90."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.testing.paged import MIXED, expected, make_batch, slot_mapping
from cuvil_backend_cuda import paged_attention as cuda_paged
from cuvil_ir.graph_ir.ops.paged import paged_attention, paged_cache_write, reference

pytestmark = pytest.mark.usefixtures("interpreter")


def _run(batch: Any) -> torch.Tensor:
    return cuda_paged.extern(reference)(*batch.operands(), scale=batch.scale)


def _check(batch: Any, atol: float = 2e-5) -> None:
    got = _run(batch)
    assert got.dtype == batch.query.dtype and got.shape == batch.query.shape
    torch.testing.assert_close(got.double(), expected(batch), rtol=atol, atol=atol)


@pytest.mark.parametrize("head_dim,group,block_size", [(24, 1, 16), (40, 2, 32), (80, 4, 16), (128, 2, 16)])
def test_mixed_batch(head_dim: int, group: int, block_size: int) -> None:
    batch = make_batch(
        [(40, 1), (17, 5), (70, 1), (3, 3)],
        heads=2 * group,
        kv_heads=2,
        head_dim=head_dim,
        block_size=block_size,
        seed=head_dim,
    )
    _check(batch)


@pytest.mark.parametrize("seqs", MIXED[2:], ids=str)
def test_mixed_batches_and_shared_prefix(seqs: list[tuple[int, int]]) -> None:
    _check(make_batch(seqs, heads=8, kv_heads=2, head_dim=24))
    _check(make_batch([(40, 1), (35, 3), (33, 1)], shared_prefix_blocks=2, heads=4, kv_heads=1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_caches_and_queries(dtype: torch.dtype) -> None:
    _check(make_batch([(40, 1), (17, 5)], cache_dtype=dtype, head_dim=40))
    batch = make_batch([(40, 1), (17, 5)], dtype=dtype, head_dim=40)
    got = _run(batch)
    assert got.dtype == dtype
    torch.testing.assert_close(got, reference(*batch.operands(), scale=batch.scale), rtol=1e-2, atol=1e-2)


def test_fewer_programs_than_items_loop_over_them() -> None:
    """The ascend target's launch (one program per core) on the same kernel."""
    from cuvil_runtime.triton_kernels.paged_attention import launch

    batch = make_batch([(40, 1), (17, 5), (3, 3)], heads=4, kv_heads=2, head_dim=24)
    got = launch(*batch.operands(), scale=batch.scale, block_n=16, programs=3)
    torch.testing.assert_close(got.double(), expected(batch), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("seqs", [[(600, 1)], [(33, 1), (200, 1)], [(300, 9)], [(40, 1), (17, 5)]], ids=str)
def test_split_along_the_sequence_and_merged(
    seqs: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few items, long spans: each item split into chunks (some past a token's position,
    some a prefill row does not reach), partials merged by the second kernel."""
    from cuvil_runtime.triton_kernels import paged_attention as kernels

    batch = make_batch(seqs, heads=4, kv_heads=2, head_dim=40, block_size=16, seed=len(seqs))
    span = batch.block_tables.shape[1] * 16
    splits, chunk = kernels.plan_splits(batch.query.shape[0] * 2, span, 16, 64, split_chunk=16)
    assert splits > 1 and chunk % 16 == 0 and splits * chunk >= span
    merges = []
    real = kernels.paged_attention_merge
    monkeypatch.setattr(kernels, "paged_attention_merge", _Recorder(real, merges))
    got = kernels.launch(*batch.operands(), scale=batch.scale, block_n=16, target=64, split_chunk=16)
    assert merges, "the items were not split"
    torch.testing.assert_close(got.double(), expected(batch), rtol=2e-5, atol=2e-5)


def test_the_default_split_for_a_long_decode() -> None:
    from cuvil_runtime.triton_kernels import paged_attention as kernels

    assert kernels.plan_splits(items=2, span=4096, block_n=32, target=264) == (8, 512)
    assert kernels.plan_splits(items=300, span=4096, block_n=32, target=264)[0] == 1  # enough items
    assert kernels.plan_splits(items=2, span=512, block_n=32, target=264)[0] == 1  # a short span
    batch = make_batch([(1500, 1)], heads=4, kv_heads=1, head_dim=24, block_size=32)
    assert kernels.plan_splits(1, batch.block_tables.shape[1] * 32, 32, 264) == (3, 512)
    _check(batch)  # through the cuda target's extern: 3 chunks of 512, merged


class _Recorder:
    def __init__(self, kernel: Any, seen: list[Any]) -> None:
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid: Any) -> Any:
        self.seen.append(grid)
        return self.kernel[grid]


def step(q, k, v, key_cache, value_cache, slots, tables, seq_lens, starts):  # type: ignore[no-untyped-def]
    paged_cache_write(k, v, key_cache, value_cache, slots)
    return paged_attention(q, key_cache, value_cache, tables, seq_lens, starts, scale=0.25)


@torch.no_grad()
def test_compiled_step_runs_the_kernel_with_one_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuvil_runtime.triton_kernels.paged_attention as kernels

    calls = []
    real = kernels.launch
    monkeypatch.setattr(kernels, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    f = cu.compile(step, target="cuda", fallback="error")
    batches = [[(40, 1), (17, 5)], [(1, 1)], [(70, 1), (33, 12), (5, 1)]]
    for i, seqs in enumerate(batches):
        batch = make_batch(seqs, heads=4, kv_heads=2, head_dim=24, seed=i)
        tokens = batch.query.shape[0]
        k, v = torch.randn(tokens, 2, 24), torch.randn(tokens, 2, 24)
        args = (
            batch.query,
            k,
            v,
            batch.key_cache,
            batch.value_cache,
            slot_mapping(batch),
            *batch.operands()[3:],
        )
        caches = (batch.key_cache.clone(), batch.value_cache.clone())
        want = step(*args[:3], *caches, *args[5:])
        got = f(*args)
        torch.testing.assert_close(batch.key_cache, caches[0], rtol=0, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == len(batches), "the cuda target did not run the Triton kernel"
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0, f.stats.recompile_reasons
    assert str(f.graphs[0]).count("in_place = true") == 2


@pytest.mark.parametrize(
    "group,head_dim,dtype,cache_dtype",
    [(4, 128, "fp32", "fp32"), (1, 24, "fp32", "fp32"), (8, 80, "bf16", "bf16"), (2, 64, "fp32", "fp16")],
)
def test_compiles_to_ptx_for_sm90(group: int, head_dim: int, dtype: str, cache_dtype: str) -> None:
    text = cuda_paged.ptx(90, group=group, head_dim=head_dim, dtype=dtype, cache_dtype=cache_dtype)
    assert ".target sm_90" in text and ".entry paged_attention_kernel" in text
    assert ".entry paged_attention_merge" in text  # the split's second pass
    assert "ex2.approx" in text  # the online softmax's exponentials


def test_integer_division_by_a_size_runs_in_the_interpreter() -> None:
    """The slot's block and offset (``paged_cache_write``): an int64 tile divided by a size,
    whose zero test was a 0-d bool that Triton's interpreter combined with the mask into int64."""

    def block_and_offset(slots: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = slots // cache.shape[1]
        return blocks, slots - blocks * cache.shape[1]

    f = cu.compile(block_and_offset, target="cuda", fallback="error")
    slots = torch.tensor([5, 17, 40, 0])
    for n in (16, 7):
        got, want = f(slots, torch.zeros(4, n)), block_and_offset(slots, torch.zeros(4, n))
        torch.testing.assert_close(got, want)
