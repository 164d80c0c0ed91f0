"""Extrema over an empty dimension raise as in eager (issue 26, item 7).

``amax``/``amin``/``max``/``min`` have no identity element: eager raises where a fused
reduction would return -inf/+inf. Capture decides each reduced size against 0, so a
symbolic size becomes a ``Ne(size, 0)`` guard and an empty call is captured again and
refused (eager's error under the default fallback, a located CompileError under
``fallback="error"``).
"""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def amax1(x):
    return torch.amax(x, dim=1)


def amin_all(x):
    return x.amin()


def max_all(x):
    return x.max()


def min_dim(x):
    return torch.min(x, 1).values


def sum_then_amax(x):
    return torch.amax(x + 1, dim=0)  # dim 0 is not empty: fine at (3, 0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [amax1, amin_all, max_all, min_dim])
def test_empty_extremum_raises_like_eager(fn, target):
    full, empty = torch.randn(3, 4), torch.randn(3, 0)
    with pytest.raises((IndexError, RuntimeError)):
        fn(empty)
    f = cu.compile(fn, target=target)
    torch.testing.assert_close(f(full), fn(full))
    # the same compiled function, now with the reduced dim empty: eager's error, no +-inf
    with pytest.raises((IndexError, RuntimeError)):
        f(empty)
    strict = cu.compile(fn, target=target, fallback="error")
    strict(full)
    with pytest.raises(cu.CompileError, match="non-zero size|numel\\(\\) == 0"):
        strict(empty)
    torch.testing.assert_close(strict(full), fn(full))


@pytest.mark.parametrize("target", TARGETS)
def test_empty_dim_not_reduced_still_compiles(target):
    f = cu.compile(sum_then_amax, target=target, fallback="error")
    for x in (torch.randn(3, 4), torch.randn(3, 0)):
        out = f(x)
        assert out.shape == sum_then_amax(x).shape
        torch.testing.assert_close(out, sum_then_amax(x))


@pytest.mark.parametrize("target", TARGETS)
def test_softmax_of_empty_dim_is_not_refused(target):
    # softmax decomposes into an amax internally; eager accepts an empty dim here
    def fn(x):
        return torch.softmax(x, dim=1)

    f = cu.compile(fn, target=target, fallback="error")
    for x in (torch.randn(3, 4), torch.randn(3, 0)):
        torch.testing.assert_close(f(x), fn(x))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", [torch.amax, torch.amin])
def test_extremum_of_a_0d_tensor_over_dim_0(op, target):
    # torch allows dim 0 (or -1) of a 0-d tensor: one element, never empty (the check of
    # the reduced sizes indexed past the shape: found by the OpInfo sweep)
    def fn(x):
        return op(x, dim=0, keepdim=True) + op(x, -1)

    cf = cu.compile(fn, target=target, fallback="error")
    x = torch.tensor(2.5)
    got, want = cf(x), fn(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
