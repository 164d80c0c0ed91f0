"""A decode step's attention over a contiguous cache (``decode_attention``: the paged kernel with
the identity block table) against torch's ``sdpa``: the masks it takes (a prefix of allowed
positions, boolean or additive) and the ones it leaves to torch, grouped and plain heads,
batches, the cache's layout as transformers keeps it and transposed; then a Llama's
``generate()`` with a static cache, compiled, against eager."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil_backend_cpu import decode_attention, paged_attention
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.paged_attention import PagedAttentionKernel

LOWEST = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def pa() -> PagedAttentionKernel:
    return paged_attention.kernel(KernelCache())


def _bool(lens: list[int], positions: int) -> torch.Tensor:
    m = torch.zeros(len(lens), 1, 1, positions, dtype=torch.bool)
    for b, n in enumerate(lens):
        m[b, ..., :n] = True
    return m


def _additive(lens: list[int], positions: int, dropped: float = LOWEST) -> torch.Tensor:
    return torch.where(_bool(lens, positions), 0.0, dropped)


def _run(mask: torch.Tensor | None, batch: int, positions: int) -> tuple[Any, Any]:
    """What ``attend`` gives for this mask, and torch's (None where torch takes no such mask)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(batch, 4, 1, 8, generator=g)
    k, v = torch.randn(batch, 2, positions, 8, generator=g), torch.randn(batch, 2, positions, 8, generator=g)
    got = decode_attention.attend(
        lambda: paged_attention.kernel(KernelCache()), q, k, v, mask, scale=0.5, enable_gqa=True
    )
    if mask is not None and mask.dtype not in (torch.bool, torch.float32):
        return got, None
    return got, F.scaled_dot_product_attention(q, k, v, mask, scale=0.5, enable_gqa=True)


def test_prefix_masks_run_the_kernel_and_others_torch(monkeypatch: Any) -> None:
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    taken = [
        (_bool([5, 9, 1], 12), 3),
        (_additive([12, 3], 12), 2),
        (_additive([4], 12, float("-inf")), 3),  # one row for every sequence
        (_bool([3, 5], 24)[..., ::2], 2),  # positions with stride 2: copied, then read
        (None, 2),
    ]
    for mask, batch in taken:
        got, want = _run(mask, batch, 12)
        assert got is not None, mask
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    hole = _bool([6], 12)
    hole[..., 2] = False  # a left-padded batch's hole: not a prefix
    refused = [
        hole,
        _bool([0], 12),  # a row that sees nothing
        _additive([4], 12, -1e4),  # a finite penalty: its exp is not exactly 0
        _additive([4], 12) + torch.linspace(0, 1, 12),  # a bias on the allowed positions
        _bool([4], 12).expand(1, 4, 1, 12),  # per-head masks
        _bool([4], 12).to(torch.float16),
    ]
    for mask in refused:
        assert _run(mask, 1, 12)[0] is None, mask


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_against_torch(heads: int, kv_heads: int, batch: int, mask_kind: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    g = torch.Generator().manual_seed(0)
    positions, dim = 70, 24
    lens = [70, 33, 1][:batch]
    mask = {"bool": _bool(lens, positions), "additive": _additive(lens, positions), "none": None}[mask_kind]
    q = torch.randn(batch, heads, 1, dim, generator=g)
    # transformers' cache layout [B, Hk, S, D], and the transposed [B, S, Hk, D] viewed as it
    k = torch.randn(batch, kv_heads, positions, dim, generator=g)
    v = torch.randn(batch, positions, kv_heads, dim, generator=g).transpose(1, 2)
    gqa = heads != kv_heads
    want = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=gqa, scale=0.3)
    got = decode_attention.attend(
        lambda: paged_attention.kernel(KernelCache()), q, k, v, mask, scale=0.3, enable_gqa=gqa
    )
    assert got is not None and got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_what_it_leaves_to_torch(monkeypatch: Any) -> None:
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    kern = lambda: paged_attention.kernel(KernelCache())  # noqa: E731
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 20, 8)
    assert decode_attention.attend(kern, q, k, k, None, scale=1.0, enable_gqa=False) is None  # 4 vs 2 heads
    assert decode_attention.attend(kern, q.repeat(1, 1, 2, 1), k, k, None, scale=1.0, enable_gqa=True) is None
    assert (
        decode_attention.attend(kern, q.double(), k.double(), k.double(), None, scale=1.0, enable_gqa=True)
        is None
    )
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 21)  # 1 x 20 cached positions: torch's
    assert decode_attention.attend(kern, q, k, k, None, scale=1.0, enable_gqa=True) is None


@torch.no_grad()
def test_compiled_generate_with_a_static_cache_runs_it(monkeypatch: Any) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(decode_attention, "MIN_CACHED", 1)
    calls = {"n": 0}
    real = decode_attention.attend

    def spy(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        calls["n"] += out is not None
        return out

    monkeypatch.setattr(decode_attention, "attend", spy)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 96, (2, 7))
    kw: dict[str, Any] = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
    want = copy.deepcopy(model).generate(ids, **kw, cache_implementation="static")
    f = cu.compile(model, target="cpu", fallback="error")
    got = f.generate(ids, **kw, cache_implementation="static")
    assert torch.equal(got, want)
    assert calls["n"] >= 2 * 5, calls  # every layer of every decode step (the first token: prefill)
