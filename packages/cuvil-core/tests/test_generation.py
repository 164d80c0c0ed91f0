"""Generation with a KV cache: a GPT-2 greedy loop calling the compiled model with
``past_key_values`` grows the cache on every step without a recompile per step (the
cache length is a size symbol), matches eager token for token, and leaves the caller's
cache object in the state eager leaves it in. Also the general rules behind it
([Note: objects in the argument tree], cuvil/frontend/arg_objects.py): arguments changed
in place are written back, objects holding tensors are never traced through or handed
back holding the trace's placeholders. ``transformers`` is a test dependency only."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import cuvil as cu
from cuvil.errors import CompileError

T = pytest.importorskip("transformers")


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not _available("cpu"), reason="no cpu"))]
V = 100  # vocabulary size
STEPS = 8


@pytest.fixture(scope="module")
def registered() -> None:
    # once per process; what users do (docs/kv-cache.md)
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()


def _gpt2() -> Any:
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64)
    return T.GPT2LMHeadModel(cfg).eval()


def _greedy(model: Any, ids: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[torch.Tensor], Any]:
    """The generation loop users write: the whole prompt once, then one token per step
    with the cache the previous step returned."""
    out = model(ids, use_cache=True)
    logits, cache = [out.logits], out.past_key_values
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(steps - 1):
        out = model(tokens[-1], past_key_values=cache, use_cache=True)
        assert out.past_key_values is cache  # eager returns the cache it was passed
        logits.append(out.logits)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1), logits, cache


@pytest.fixture
def unregistered() -> Any:
    """DynamicCache as transformers leaves it (not a pytree node), for this test only."""
    from transformers.cache_utils import DynamicCache

    was = DynamicCache in pytree.SUPPORTED_NODES
    if was:
        pytree._deregister_pytree_node(DynamicCache)
    yield
    if was:
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()


@pytest.mark.parametrize("target", TARGETS)
@torch.no_grad()
def test_unregistered_cache_is_an_argument_by_its_attributes(unregistered: None, target: str) -> None:
    """DynamicCache as transformers leaves it (no pytree registration): returned whole, then
    passed back and flattened by its attributes (rule 0), grown in place like eager."""
    model = _gpt2()
    f = cu.compile(model, target=target, fallback="error")
    ids = torch.randint(0, V, (1, 4))
    got, want = f(ids, use_cache=True).past_key_values, model(ids, use_cache=True).past_key_values
    # the cache the model built is this call's, holding tensors, never the trace's placeholders
    for g, w in zip(got.layers, want.layers):
        assert type(g.keys) is torch.Tensor and type(g.values) is torch.Tensor
        torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)
    assert f(ids, use_cache=True).past_key_values is not got
    layers = list(got.layers)
    for step in range(3):
        nxt = torch.tensor([[3 + step]])
        out, ref = (
            f(nxt, past_key_values=got, use_cache=True),
            model(nxt, past_key_values=want, use_cache=True),
        )
        assert out.past_key_values is got and [id(x) for x in got.layers] == [id(x) for x in layers]
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
        for g, w in zip(got.layers, want.layers):
            assert type(g.keys) is torch.Tensor and g.keys.shape == w.keys.shape == (1, 2, 5 + step, 16)
            torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)
    # the prompt and the step: one variant each, whatever the cache length
    assert f.stats.compiles == 2 and f.stats.fallbacks == 0, f.stats.recompile_reasons


@pytest.mark.parametrize("target", TARGETS)
@torch.no_grad()
def test_greedy_generation_with_cache_matches_eager_with_two_compiles(registered: None, target: str) -> None:
    model = _gpt2()
    f = cu.compile(model, target=target, fallback="error")
    for batch, prompt in ((1, 5), (2, 3)):
        ids = torch.randint(0, V, (batch, prompt))
        want_tokens, want_logits, want_cache = _greedy(model, ids, STEPS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got_tokens, got_logits, got_cache = _greedy(f, ids, STEPS)
        # none of ours (a deprecated torch API in cuvil warned on every call); transformers'
        # own past_key_values deprecation, which eager emits too, is not
        ours = [f"{w.filename}: {w.message}" for w in caught if "past_key_values" not in str(w.message)]
        assert not ours, ours
        assert torch.equal(got_tokens, want_tokens)
        for g, w in zip(got_logits, want_logits):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        # the caller's cache object holds what eager's holds: prompt + steps - 1 positions
        assert type(got_cache) is type(want_cache) and len(got_cache.layers) == len(want_cache.layers)
        for g, w in zip(got_cache.layers, want_cache.layers):
            assert type(g) is type(w) and g.is_initialized
            assert g.keys.shape == (batch, 2, prompt + STEPS - 1, 16)
            torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(g.values, w.values, rtol=1e-4, atol=1e-5)
    # the prompt call and the step call, for every batch, prompt and cache length
    assert f.stats.compiles == 2, f.stats.recompile_reasons
    assert f.stats.fallbacks == 0


@torch.no_grad()
def test_cache_is_updated_in_place_like_eager(registered: None) -> None:
    """The cache the caller passed is the one that grows, keeping its layer objects, even
    when the caller ignores the result."""
    model = _gpt2()
    f = cu.compile(model, target="reference", fallback="error")
    ids = torch.randint(0, V, (1, 4))
    cache = f(ids, use_cache=True).past_key_values
    ref = model(ids, use_cache=True).past_key_values
    layers = list(cache.layers)
    nxt = torch.tensor([[7]])
    f(nxt, past_key_values=cache, use_cache=True)
    model(nxt, past_key_values=ref, use_cache=True)
    assert [id(x) for x in cache.layers] == [id(x) for x in layers]
    assert cache.get_seq_length() == ref.get_seq_length() == 5
    for g, w in zip(cache.layers, ref.layers):
        assert type(g.keys) is torch.Tensor  # never a trace placeholder
        torch.testing.assert_close(g.keys, w.keys, rtol=1e-4, atol=1e-5)


class _Box:
    """A plain object holding tensors (not a pytree node)."""

    def __init__(self, t: torch.Tensor, n: int) -> None:
        self.t, self.n, self.parts = t, n, [t * 2]


@pytest.mark.parametrize("target", TARGETS)
def test_returned_plain_object_holds_this_calls_tensors(target: str) -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, _Box]:
        return x + 1, _Box(x.sin(), 3)

    cf = cu.compile(f, target=target, fallback="error")
    for n in (3, 5):
        x = torch.randn(n)
        y, box = cf(x)
        assert type(box) is _Box and box.n == 3
        assert type(box.t) is torch.Tensor and type(box.parts[0]) is torch.Tensor
        torch.testing.assert_close(box.t, x.sin())
        torch.testing.assert_close(box.parts[0], x.sin() * 2)
        torch.testing.assert_close(y, x + 1)
    first, _ = cf(torch.ones(2))[1], None
    assert cf(torch.zeros(2))[1] is not first  # each call its own object
    assert cf.stats.compiles == 1


@pytest.mark.parametrize("target", TARGETS)
def test_plain_object_argument_is_flattened_by_its_attributes(target: str) -> None:
    """Rule 0: a plain object's tensors are graph inputs (a new tensor in it is used, never a
    stale one) and its other attributes part of the structure key; an int above 0 is a size
    symbol ([Note: int attributes are sizes]): 0 -> 1 recompiles, 1 -> 2 -> 3 does not."""

    def f(box: _Box, x: torch.Tensor) -> torch.Tensor:
        return box.t * box.n + box.parts[0] + x

    cf = cu.compile(f, target=target, fallback="error")
    for n, k in ((3, 0), (5, 0), (4, 1), (2, 2), (3, 3)):
        box, x = _Box(torch.randn(n), k), torch.randn(n)
        torch.testing.assert_close(cf(box, x), f(box, x))
    box.t = torch.randn(3)  # the same object, a new tensor
    torch.testing.assert_close(cf(box, x), f(box, x))
    assert cf.stats.compiles == 2, cf.stats.recompile_reasons  # n=0, then n a size
    assert "argument box_n: was int 0, now an int (a size symbol)" in cf.stats.recompile_reasons[0]


class _Slotted:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_object_argument_without_attributes_holding_tensors_is_refused() -> None:
    def f(box: _Slotted, x: torch.Tensor) -> torch.Tensor:
        return box.t + x

    cf = cu.compile(f, target="reference", fallback="error")
    with pytest.raises(CompileError, match=r"argument box is a _Slotted that holds tensors \(box\.t\)"):
        cf(_Slotted(torch.ones(2)), torch.ones(2))


def test_shared_object_holding_tensors_is_refused() -> None:
    """An object reached twice cannot be flattened keeping the sharing: refused, not
    silently duplicated."""

    def f(pair: tuple[_Box, _Box], x: torch.Tensor) -> torch.Tensor:
        return pair[0].t + pair[1].t + x

    box = _Box(torch.ones(2), 1)
    cf = cu.compile(f, target="reference", fallback="error")
    with pytest.raises(CompileError, match="holds tensors"):
        cf((box, box), torch.ones(2))


@pytest.mark.parametrize("target", TARGETS)
def test_list_argument_changed_in_place_is_written_back(target: str) -> None:
    def f(x: torch.Tensor, acc: list[torch.Tensor]) -> torch.Tensor:
        acc.append(x * 2)
        return x + 1

    cf = cu.compile(f, target=target, fallback="error")
    for n in (3, 4):
        x = torch.randn(n)
        acc = [x.clone()]
        first = acc[0]
        y = cf(x, acc)
        torch.testing.assert_close(y, x + 1)
        assert len(acc) == 2 and acc[0] is first  # the untouched element is the caller's tensor
        torch.testing.assert_close(acc[1], x * 2)
    assert cf.stats.compiles == 1


class _Layer:
    def __init__(self, keys: torch.Tensor, seen: int) -> None:
        self.keys, self.seen = keys, seen


class _Cache:
    def __init__(self, layers: list[_Layer], meta: dict[str, torch.Tensor]) -> None:
        self.layers, self.meta = layers, meta


def _grow(cache: _Cache, k: torch.Tensor) -> torch.Tensor:
    for layer in cache.layers:  # a new tensor per layer, a count that grows: structure kept
        layer.keys = torch.cat([layer.keys, k])
        layer.seen += k.shape[0]
    cache.meta["last"] = k * 2
    return sum(layer.keys.sum() for layer in cache.layers)


@pytest.mark.parametrize("target", TARGETS)
def test_an_argument_that_keeps_its_structure_is_written_back_leaf_by_leaf(target: str) -> None:
    """A decode step's cache: new tensors in the same attributes, lists and dicts. The
    write-back sets each leaf in place (WriteBack.places), keeping the caller's objects,
    and ends as eager leaves them."""
    cf = cu.compile(_grow, target=target, fallback="error")
    mine = _Cache([_Layer(torch.ones(2, 3), 2), _Layer(torch.zeros(2, 3), 2)], {"last": torch.zeros(1, 3)})
    theirs = _Cache([_Layer(torch.ones(2, 3), 2), _Layer(torch.zeros(2, 3), 2)], {"last": torch.zeros(1, 3)})
    layers, first, meta = mine.layers, mine.layers[0], mine.meta
    for step in range(3):
        k = torch.randn(1 + step % 2, 3)
        torch.testing.assert_close(cf(mine, k), _grow(theirs, k))
        assert mine.layers is layers and mine.layers[0] is first and mine.meta is meta
        for a, b in zip(mine.layers, theirs.layers):
            torch.testing.assert_close(a.keys, b.keys)
            assert type(a.seen) is int and a.seen == b.seen
        torch.testing.assert_close(mine.meta["last"], theirs.meta["last"])
    assert cf.stats.compiles == 1, cf.stats.recompile_reasons
    (w,) = cf.artifacts[-1].captured.write_backs
    assert w.places is not None and ("layers", (1,), "keys") in w.places


class _State:
    """A registered object whose counter is in the flatten context."""

    def __init__(self, t: torch.Tensor, n: int) -> None:
        self.t, self.n = t, n


class _Lossy:
    """A registered object whose flatten forgets ``seen``."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.seen = t, 0


pytree.register_pytree_node(_State, lambda s: ([s.t], s.n), lambda leaves, n: _State(leaves[0], n))
pytree.register_pytree_node(_Lossy, lambda s: ([s.t], None), lambda leaves, _: _Lossy(leaves[0]))


def _step(x: torch.Tensor, s: _State) -> torch.Tensor:
    s.t = s.t + x
    s.n += 1
    return s.t * 2


@pytest.mark.parametrize("target", TARGETS)
def test_registered_object_changed_in_place_ends_like_eager(target: str) -> None:
    cf = cu.compile(_step, target=target, fallback="error")
    x = torch.randn(3)
    got, want = _State(torch.zeros(3), 0), _State(torch.zeros(3), 0)
    for _ in range(2):
        y = cf(x, got)
        torch.testing.assert_close(y, _step(x, want))
        assert type(got.t) is torch.Tensor and got.n == want.n
        torch.testing.assert_close(got.t, want.t)
    # the counter is in the flatten context: each value is a variant (never a stale one)
    assert cf.stats.compiles == 2 and got.n == 2


def test_state_a_registered_flatten_loses_is_refused_never_stale() -> None:
    def f(x: torch.Tensor, s: _Lossy) -> torch.Tensor:
        return x + s.t

    cf = cu.compile(f, target="reference", fallback="error")
    s = _Lossy(torch.ones(2))
    torch.testing.assert_close(cf(torch.ones(2), s), torch.full((2,), 2.0))
    s.seen = 3  # not in its leaves or context: the rebuilt object would say 0
    with pytest.raises(CompileError, match=r"_Lossy\.seen is 3 in the argument but 0 when rebuilt"):
        cf(torch.ones(2), s)
    assert cf.stats.recompile_reasons[-1] == "argument object _Lossy.seen: was 0, now 3"


def test_change_a_registered_flatten_loses_is_refused() -> None:
    def f(x: torch.Tensor, s: _Lossy) -> torch.Tensor:
        s.seen += 1  # eager counts; a write-back from the leaves would drop it
        return x + s.t

    cf = cu.compile(f, target="reference", fallback="error")
    s = _Lossy(torch.ones(2))
    with pytest.raises(
        CompileError, match=r"changes argument s \(a _Lossy\).*_Lossy\.seen is 1 after the call"
    ):
        cf(torch.ones(2), s)
    assert s.seen == 0 and cf.stats.fallbacks == 0
