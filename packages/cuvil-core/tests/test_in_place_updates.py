"""Argument tensors overwritten in place, not through a clone ([Note: updates in place] in
cuvil_ir/graph_ir/in_place.py): which calls qualify, that the run writes the caller's
tensor itself, and that a second input sharing its storage makes the call clone again."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil.inspection import captured_call

TARGETS = ["reference", "cpu"]


def step(cache, pos, k):
    """A decode step's cache write: overwrite one position, then read the whole cache."""
    cache.index_copy_(2, pos, k)
    return (cache * 2).sum(-1)


def _clones_of(monkeypatch: pytest.MonkeyPatch, tensor: torch.Tensor) -> list[int]:
    """A spy on Tensor.clone: counts the clones of ``tensor`` (its storage)."""
    seen: list[int] = []
    real = torch.Tensor.clone
    ptr = tensor.untyped_storage().data_ptr()

    def clone(self: torch.Tensor, *a, **kw):  # type: ignore[no-untyped-def]
        if self.untyped_storage().data_ptr() == ptr:
            seen.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "clone", clone)
    return seen


@pytest.mark.parametrize("target", TARGETS)
def test_an_overwrite_of_an_argument_writes_it_in_place(target, monkeypatch):
    f = cu.compile(step, target=target, fallback="error")
    cache, k = torch.randn(1, 2, 16, 4), torch.randn(1, 2, 1, 4)
    captured, _ = captured_call(step, cache, torch.tensor([3]), k)
    assert "in_place = true" in str(captured.graph)
    assert len(captured.written_in_place) == 1
    for p in (3, 9, 0):
        pos = torch.tensor([p])
        want_cache = cache.clone()
        want = step(want_cache, pos, k)
        ptr = cache.data_ptr()
        clones = _clones_of(monkeypatch, cache)
        got = f(cache, pos, k)
        monkeypatch.undo()
        assert not clones, "the cache was cloned"
        assert cache.data_ptr() == ptr
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(cache, want_cache)
        k = torch.randn(1, 2, 1, 4)
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0


@pytest.mark.parametrize("target", TARGETS)
def test_an_input_sharing_the_storage_makes_the_call_clone(target, monkeypatch):
    def g(cache, view, pos, k):
        cache.index_copy_(2, pos, k)
        return cache.sum(-1) + view.sum()

    f = cu.compile(g, target=target, fallback="error")
    cache, k, pos = torch.randn(1, 2, 16, 4), torch.randn(1, 2, 1, 4), torch.tensor([5])
    other = torch.randn(3, 4)
    f(cache.clone(), other, pos, k)  # compiled with two separate tensors
    before = cache.clone()
    clones = _clones_of(monkeypatch, cache)
    got = f(cache, cache[0, 0, 5:8], pos, k)  # the view reads the positions written
    monkeypatch.undo()
    assert clones, "with a second input on the same storage the call must clone"
    # the graph reads every input before the update (a pure function of its inputs)
    want = before.index_copy(2, pos, k).sum(-1) + before[0, 0, 5:8].sum()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache, before.index_copy(2, pos, k))


def test_what_qualifies():
    def read_before(cache, pos, k):  # the old value is read too: a clone keeps it
        old = cache.sum()
        cache.index_copy_(2, pos, k)
        return cache.sum(-1) + old

    def accumulates(cache, pos, k):  # the result depends on what was there
        cache.index_add_(2, pos, k)
        return cache.sum(-1)

    def twice(cache, pos, k):  # the first overwrite qualifies; the second's operand is no input
        cache.index_copy_(2, pos, k)
        cache.index_copy_(2, pos + 1, k)
        return cache.sum(-1)

    args = (torch.randn(1, 2, 16, 4), torch.tensor([2]), torch.randn(1, 2, 1, 4))
    assert captured_call(read_before, *args)[0].written_in_place == ()
    assert captured_call(accumulates, *args)[0].written_in_place == ()
    c, _ = captured_call(twice, *args)
    assert c.written_in_place == (0,) and str(c.graph).count("in_place = true") == 1
    for fn in (read_before, accumulates, twice):
        f = cu.compile(fn, target="cpu", fallback="error")
        a = tuple(t.clone() for t in args)
        b = tuple(t.clone() for t in args)
        torch.testing.assert_close(f(*a), fn(*b))
        torch.testing.assert_close(a[0], b[0])


def test_a_static_cache_decode_step_writes_the_cache_in_place(monkeypatch):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    compiled = cu.compile(model, target="cpu", fallback="error")
    ids = torch.randint(0, 64, (1, 5))
    kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        got = compiled.generate(ids, **kw)
        assert torch.equal(got, want)
        graphs = [a.captured.graph for a in compiled.artifacts if a.captured is not None]
        # the decode variant writes both caches of each layer in place
        assert max(str(g).count("in_place = true") for g in graphs) == 2 * cfg.num_hidden_layers
        cache = transformers.StaticCache(config=cfg, max_cache_len=16)
        compiled(ids, cache=cache, use_cache=True)  # prefill
        keys = cache.layers[0].keys
        clones = _clones_of(monkeypatch, keys)
        out = compiled(ids[:, -1:], cache=cache, use_cache=True, cache_position=torch.tensor([5]))
        monkeypatch.undo()
        assert not clones and cache.layers[0].keys is keys
        ref_cache = transformers.StaticCache(config=cfg, max_cache_len=16)
        model(ids, cache=ref_cache, use_cache=True)
        ref = model(ids[:, -1:], cache=ref_cache, use_cache=True, cache_position=torch.tensor([5]))
        torch.testing.assert_close(out.logits, ref.logits)
        torch.testing.assert_close(keys, ref_cache.layers[0].keys)


def test_exclusive_tells_views_of_the_written_storage_apart() -> None:
    """The per-call check: another input inside a written tensor's storage (a view of it,
    its last element included) makes the call clone; other storages and an empty view at
    its end do not; two written inputs in one storage clone."""
    from cuvil_ir.graph_ir.in_place import exclusive

    cache, other = torch.zeros(4, 8), torch.zeros(3)
    assert exclusive([cache, other], [0])
    assert not exclusive([cache, other, cache[1:2]], [0])
    assert not exclusive([cache, other, cache[3, 7:]], [0])
    assert exclusive([cache, other, cache[4:]], [0])
    assert not exclusive([cache[:2], cache[2:]], [0, 1])
    assert not exclusive([torch.zeros(0), other], [0])  # no bytes: cloned, as before
