"""Target options of ``cu.compile`` (``cuda_graphs=False`` on ``cuda``): a keyword the
target does not take is a TypeError, never silently ignored or hidden by the eager
fallback."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu


def f(x):
    return x * 2 + 1


def test_unknown_option_for_a_named_target_fails_at_compile():
    with pytest.raises(TypeError, match=r"\['cuda_graphs'\].*'cpu'.*takes: none"):
        cu.compile(f, target="cpu", cuda_graphs=False)


def test_unknown_option_for_the_default_target_fails_at_the_first_call_even_with_fallback():
    cf = cu.compile(f, fallback="eager", colour="blue")
    with pytest.raises(TypeError, match="colour"):
        cf(torch.randn(3))
    assert cf.stats.fallbacks == 0


def test_options_are_sorted_into_compile_options():
    cf = cu.compile(f, target="reference")
    assert cf.options == ()
