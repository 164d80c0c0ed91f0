"""Sizes that only might be special compile once, exactly (issue 28: a decoder's batch of
one, a sliding window that fills):

- advanced indexing and in-place calls run torch's general path for sizes ([Note: torch's
  general path for sizes] in cuvil_ir/graph_ir/fake.py): broadcasting a batch of one is
  not a guard, and ``squeeze`` (whose general path would be wrong) still decides;
- ``expand`` prefers equal sizes, as broadcasting does;
- ``min``/``max`` of sizes are ``Min``/``Max`` sizes ([Note: min and max of sizes] in
  cuvil/frontend/builtin_args.py), in converted code and in code that runs as it is;
- ``x[-k:]`` with a symbolic ``k`` is one variant on both sides of its clamp ([Note: the
  last k of a size] in cuvil_ir/graph_ir/ops/index.py).

Every case compares with eager on both sides of the special size."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cuvil as cu

TARGETS = ["reference", "cpu"]


def _padding_mask(mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # transformers' padding mask: index tensors of shapes (b, 1, 1, 1) and (1, 1, 1, kv)
    b, kv = mask.shape
    batch_idx = torch.arange(b)[:, None, None, None]
    kv_idx = torch.arange(kv)[None, None, None, :]
    return torch.where(mask[batch_idx, kv_idx], q, 0.0)


@pytest.mark.parametrize("target", TARGETS)
def test_a_batch_of_one_in_advanced_indexing_is_not_a_variant(target: str) -> None:
    f = cu.compile(_padding_mask, target=target, fallback="error")
    for b, kv in ((1, 5), (3, 5), (1, 7), (2, 3)):
        mask = torch.rand(b, kv) > 0.3
        q = torch.randn(b, 2, 3, kv)
        torch.testing.assert_close(f(mask, q), _padding_mask(mask, q))
    assert f.stats.compiles == 1, f.stats.recompile_reasons


def _broadcast_index(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return x[i, j] * 2  # i and j broadcast against each other


@pytest.mark.parametrize("target", TARGETS)
def test_index_tensors_that_really_broadcast_take_the_examples_path(target: str) -> None:
    """A size-1 index that broadcasts against a longer one does not fit torch's general
    path (it assumes equal sizes and checks): the call is typed the example's way."""
    f = cu.compile(_broadcast_index, target=target, fallback="error")
    x = torch.randn(6, 7)
    for n, m in ((1, 4), (3, 3), (1, 4)):
        i, j = torch.randint(0, 6, (n,)), torch.randint(0, 7, (m,))
        torch.testing.assert_close(f(x, i, j), _broadcast_index(x, i, j))
    assert f.stats.fallbacks == 0


def _squeezed(x: torch.Tensor) -> torch.Tensor:
    return torch.squeeze(x, 0).sum(-1)


@pytest.mark.parametrize("target", TARGETS)
def test_squeeze_still_decides_a_dim_of_one(target: str) -> None:
    """torch's general path keeps a dim that might be 1, where eager squeezes it: squeeze
    is not run that way, a batch of one is its own exact variant."""
    f = cu.compile(_squeezed, target=target, fallback="error")
    for b in (1, 3, 1, 2):
        x = torch.randn(b, 4, 5)
        got, want = f(x), _squeezed(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
    assert f.stats.compiles == 2, f.stats.recompile_reasons


class Layer:
    """A static cache layer: a preallocated tensor written in place."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys


def _write(layer: Layer, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    rolled = layer.keys.roll(-1, dims=-2)
    rolled[:, :, pos] = k  # __setitem__ with a tensor index: advanced indexing
    layer.keys.copy_(rolled)  # an in-place call
    return layer.keys.sum(-1)


@pytest.mark.parametrize("target", TARGETS)
def test_in_place_writes_of_a_batch_of_one_are_not_a_variant(target: str) -> None:
    f = cu.compile(_write, target=target, fallback="error")
    for b in (1, 3, 1, 2):
        keys = torch.randn(b, 2, 6, 4)
        mine, theirs = Layer(keys.clone()), Layer(keys.clone())
        k, pos = torch.randn(b, 2, 1, 4), torch.tensor([5])
        torch.testing.assert_close(f(mine, k, pos), _write(theirs, k, pos))
        torch.testing.assert_close(mine.keys, theirs.keys)
    assert f.stats.compiles == 1, f.stats.recompile_reasons


def _repeat_kv(layer: Layer, q: torch.Tensor) -> torch.Tensor:
    # transformers' repeat_kv: the cache's batch expanded to the query's
    b, h, s, d = layer.keys.shape
    k = layer.keys[:, :, None, :, :].expand(q.shape[0], h, 2, s, d).reshape(q.shape[0], h * 2, s, d)
    return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("target", TARGETS)
def test_expand_prefers_equal_sizes(target: str) -> None:
    f = cu.compile(_repeat_kv, target=target, fallback="error")
    for b in (1, 2, 1, 3):
        layer, q = Layer(torch.randn(b, 2, 5, 4)), torch.randn(b, 4, 1, 4)
        torch.testing.assert_close(f(layer, q), _repeat_kv(layer, q))
    assert f.stats.compiles == 1, f.stats.recompile_reasons


class Window:
    def __init__(self, keys: torch.Tensor, length: int, window: int) -> None:
        self.keys = keys
        self.length = length
        self.window = window


def _sliding(w: Window, k: torch.Tensor) -> torch.Tensor:
    # transformers' DynamicSlidingWindowLayer and get_mask_sizes
    w.length += k.shape[0]
    full = torch.cat([w.keys, k])
    w.keys = full[-w.window + 1 :]  # the last window - 1 rows, or all of them
    offset = max(w.length - w.window + 1, 0)  # a Max size, not a guard
    return full.sum(0) + torch.arange(offset, offset + 2).float().sum()


@pytest.mark.parametrize("target", TARGETS)
def test_a_filling_window_is_one_variant(target: str) -> None:
    f = cu.compile(_sliding, target=target, fallback="error")
    mine, theirs = Window(torch.randn(2, 3), 2, 6), Window(torch.randn(2, 3), 2, 6)
    theirs.keys = mine.keys.clone()
    for _ in range(9):  # the window fills, then slides
        k = torch.randn(1, 3)
        torch.testing.assert_close(f(mine, k), _sliding(theirs, k))
        assert mine.length == theirs.length and mine.keys.shape == theirs.keys.shape
        torch.testing.assert_close(mine.keys, theirs.keys)
    assert f.stats.compiles == 1, f.stats.recompile_reasons


# code that runs as it is (no source to convert: library code is run like this)
_namespace: dict[str, Any] = {}
exec("def clamp_low(n, k):\n    return max(n - k, 0), min(n, k)", _namespace)
clamp_low = _namespace["clamp_low"]
del _namespace


def _clamped(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    lo, hi = clamp_low(x.shape[0], k.shape[0])
    return x[lo:].sum(0) + x[:hi].sum(0)


@pytest.mark.parametrize("target", TARGETS)
def test_min_and_max_of_sizes_in_code_run_as_it_is(target: str) -> None:
    f = cu.compile(_clamped, target=target, fallback="error")
    for n, k in ((5, 2), (3, 7), (4, 4), (9, 1)):
        x, kk = torch.randn(n, 3), torch.randn(k)
        torch.testing.assert_close(f(x, kk), _clamped(x, kk))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert max(3, 4) == 4 and min([2, 5]) == 2 and max("ab", "b") == "b"  # the builtins outside


def _converted_clamp(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    n = max(x.shape[0] - k.shape[0], 1)
    return torch.ones(n, 2) * x.sum()


@pytest.mark.parametrize("target", TARGETS)
def test_min_and_max_of_sizes_in_converted_code(target: str) -> None:
    f = cu.compile(_converted_clamp, target=target, fallback="error")
    for n, k in ((5, 2), (3, 7), (6, 1)):
        x, kk = torch.randn(n, 3), torch.randn(k)
        got = f(x, kk)
        assert got.shape == _converted_clamp(x, kk).shape
        torch.testing.assert_close(got, _converted_clamp(x, kk))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert max is __builtins__["max"] if isinstance(__builtins__, dict) else max is __builtins__.max
