"""The ``ascend`` target's paged attention in simulation: the Triton kernel the ``cuda`` target
runs, launched under Ascend's rules (one program per vector core at most, looping over its
items; no warps; tiles within the unified buffer), against attention computed in float64 position
by position (:mod:`cuvil.testing.paged`), and through ``cu.compile`` with one compile. Its
TTIR -> Linalg check is in ``test_ascend_compile.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.testing.paged import expected, make_batch, slot_mapping
from cuvil_backend_ascend import paged_attention as ascend_paged
from cuvil_backend_ascend.policy import POLICY, AscendPolicy
from cuvil_backend_ascend.rules import LaunchRuleError
from cuvil_ir.graph_ir.ops.paged import paged_attention, paged_cache_write, reference

pytestmark = pytest.mark.usefixtures("simulation")


def _check(batch: Any, cores: int = 40, policy: AscendPolicy = POLICY) -> list[Any]:
    launches: list[Any] = []
    got = ascend_paged.extern(reference, policy, cores, launches)(*batch.operands(), scale=batch.scale)
    assert got.dtype == batch.query.dtype
    torch.testing.assert_close(got.double(), expected(batch), rtol=2e-5, atol=2e-5)
    return launches


@pytest.mark.parametrize("head_dim,group,block_size", [(24, 1, 16), (40, 2, 32), (80, 4, 16), (128, 2, 32)])
def test_mixed_batch_under_the_launch_rules(head_dim: int, group: int, block_size: int) -> None:
    batch = make_batch(
        [(40, 1), (17, 5), (70, 1), (3, 3)],
        heads=2 * group,
        kv_heads=2,
        head_dim=head_dim,
        block_size=block_size,
        seed=head_dim,
    )
    ((grid, config),) = _check(batch, cores=5)
    assert grid == (5,), "one program per core, each looping over its items"
    assert set(config) == {"GP", "DP", "BLOCK_N"}  # no num_warps, no num_stages
    assert ascend_paged.needed_bytes(config, 4, POLICY) <= POLICY.budget


def test_shared_prefix_and_half_cache() -> None:
    _check(make_batch([(40, 1), (35, 3), (33, 1)], shared_prefix_blocks=2, heads=4, kv_heads=1))
    _check(make_batch([(40, 1), (17, 5)], cache_dtype=torch.float16, head_dim=40))


def test_a_long_decode_is_split_across_the_cores() -> None:
    from cuvil_runtime.triton_kernels import paged_attention as kernels

    batch = make_batch([(1100, 1)], heads=4, kv_heads=1, head_dim=24, block_size=32)
    assert kernels.plan_splits(1, batch.block_tables.shape[1] * 32, 64, 40)[0] > 1
    ((grid, config),) = _check(batch, cores=40)
    assert grid == (1,) and config["BLOCK_N"] == 64  # one item, before the split


def test_tiles_shrink_to_fit_the_unified_buffer() -> None:
    small = AscendPolicy(ub_bytes=96 * 1024)
    big, tight = ascend_paged.choose(4, 128, 4, POLICY), ascend_paged.choose(4, 128, 4, small)
    assert tight["BLOCK_N"] < big["BLOCK_N"]
    assert ascend_paged.needed_bytes(tight, 4, small) <= small.budget
    _check(make_batch([(40, 1), (17, 5)], heads=8, kv_heads=2, head_dim=128), cores=3, policy=small)


def test_a_head_no_tile_can_hold_is_a_rule_error() -> None:
    tiny = AscendPolicy(ub_bytes=16 * 1024)
    batch = make_batch([(40, 1)], heads=8, kv_heads=1, head_dim=128)
    with pytest.raises(LaunchRuleError, match="unified buffer"):
        ascend_paged.extern(reference, tiny, 40)(*batch.operands(), scale=batch.scale)
    with pytest.raises(LaunchRuleError, match="not Ascend's"):
        ascend_paged.check_launch({"GP": 1, "DP": 16, "BLOCK_N": 8, "num_warps": 4}, (1,), 4, POLICY)


def step(q, k, v, key_cache, value_cache, slots, tables, seq_lens, starts):  # type: ignore[no-untyped-def]
    paged_cache_write(k, v, key_cache, value_cache, slots)
    return paged_attention(q, key_cache, value_cache, tables, seq_lens, starts, scale=0.25)


@torch.no_grad()
def test_compiled_step_runs_the_kernel_with_one_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    import cuvil_runtime.triton_kernels.paged_attention as kernels

    calls = []
    real = kernels.launch
    monkeypatch.setattr(kernels, "launch", lambda *a, **kw: calls.append(kw["programs"]) or real(*a, **kw))
    f = cu.compile(step, target="ascend", fallback="error")
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
    assert len(calls) == len(batches), "the ascend target did not run the Triton kernel"
    assert all(1 <= p <= POLICY.cores for p in calls)
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0, f.stats.recompile_reasons
