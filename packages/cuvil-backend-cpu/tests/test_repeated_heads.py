"""Grouped-query attention without repeated key heads (``cuvil_backend_cpu.repeated_heads``):
transformers' ``repeat_kv`` before ``sdpa`` becomes ``sdpa(..., enable_gqa=True)`` over the
key heads themselves, checked against eager (values and dtypes) at prefill and decode
sizes, with masks, symbolic sizes through one compile, a transformers Llama decoder, and
the chains that must stay as they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil_backend_cpu import repeated_heads
from cuvil_backend_cpu.testing import executable_of


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # transformers' own (models/llama, integrations/sdpa_attention)
    batch, heads, slen, dim = x.shape
    x = x[:, :, None, :, :].expand(batch, heads, n_rep, slen, dim)
    return x.reshape(batch, heads * n_rep, slen, dim)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # heads of a known count, as a model's projections give them: (B, S, 2 * 16) viewed
    b, s = k.shape[0], k.shape[1]
    k, v = k.view(b, s, 2, 16).transpose(1, 2), v.view(b, s, 2, 16).transpose(1, 2)
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask)


def lowered(f: Any) -> str:
    graph = executable_of(f).program.graph
    assert graph is not None
    return graph.text


def _inputs(b: int, hq: int, hk: int, lq: int, s: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, hq, 16, generator=g).transpose(1, 2)
    k, v = torch.randn(b, s, hk * 16, generator=g), torch.randn(b, s, hk * 16, generator=g)
    mask = torch.rand(b, 1, lq, s, generator=g) > 0.2
    mask[..., 0] = True
    return q, k, v, mask


def test_repeated_heads_become_grouped_query_attention() -> None:
    f = cu.compile(attend, target="cpu", fallback="error")
    for b, lq, s in ((2, 1, 40), (1, 1, 300), (3, 20, 20)):  # decode steps and a prefill
        args = _inputs(b, 8, 2, lq, s, seed=s)
        got, want = f(*args), attend(*args)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    text = lowered(f)
    # the repeats (unsqueeze, expand, reshape) are gone; the two head views stay
    assert "enable_gqa = true" in text and "expand" not in text and text.count("reshape") == 2, text


def _heads(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], 2, 16).transpose(1, 2)


def _repeat_also_returned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Any:
    kr = repeat_kv(_heads(k), 4)
    return F.scaled_dot_product_attention(q, kr, repeat_kv(_heads(v), 4), attn_mask=mask), kr


def _repeated_differently(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Any:
    # heads repeated as blocks (torch.repeat's order), not each head in a row: not grouped attention
    k, v = _heads(k).repeat(1, 4, 1, 1), _heads(v).repeat(1, 4, 1, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_a_repeat_read_elsewhere_stays_and_other_repeats_are_not_matched() -> None:
    args = _inputs(2, 8, 2, 1, 30)
    f = cu.compile(_repeat_also_returned, target="cpu", fallback="error")
    got, want = f(*args), _repeat_also_returned(*args)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1])
    assert "enable_gqa = true" in lowered(f)  # the attention still reads k unrepeated
    g = cu.compile(_repeated_differently, target="cpu", fallback="error")
    torch.testing.assert_close(g(*args), _repeated_differently(*args), rtol=1e-5, atol=1e-5)
    assert "enable_gqa = true" not in lowered(g)


def test_rewrite_is_deterministic_and_leaves_other_graphs() -> None:
    f = cu.compile(attend, target="cpu", fallback="error")
    f(*_inputs(1, 4, 2, 1, 12))
    graph = f.graphs[-1]
    assert repeated_heads.rewrite(graph).text == repeated_heads.rewrite(graph).text != graph.text
    plain = cu.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), target="cpu")
    q = torch.randn(1, 2, 3, 8)
    plain(q, q, q)
    assert repeated_heads.rewrite(plain.graphs[-1]) is plain.graphs[-1]


@torch.no_grad()
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_llama_decoder_reads_its_cache_unrepeated(cache: str) -> None:
    """Every layer's attention, not only the first: with a static cache, the later layers'
    cache sizes are known through conjunctions (``Eq(c1_0, c0_0) & Eq(c1_1, 2)``) and the
    query's heads through ``Eq(64*floor(8*b*s/c0_0), 512)`` (both used to stop the match)."""
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = T.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 96, (2, 6))
    m = cu.compile(model, target="cpu", fallback="error")
    kw = {"max_new_tokens": 5, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    assert torch.equal(m.generate(ids, **kw), model.generate(ids, **kw))
    for art in m.artifacts:
        assert art.executable is not None
        text = art.executable.program.graph.text
        assert text.count("enable_gqa = true") == 3 and "expand" not in text, text
