"""Int attributes of argument objects are size symbols under ``dynamic=True``
([Note: int attributes are sizes] in cuvil/frontend/arg_objects.py): one compile for
every length a cache-like object carries, what the code decides about the value is a
size guard, a changed int is written back to the caller as a plain int; the int 0,
plain int arguments and ``dynamic=False`` stay specialized by value."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

TARGETS = ["reference", "cpu"]


class Window:
    """A plain object, as transformers' cache layers are: tensors and ints in attributes."""

    def __init__(self, keys: torch.Tensor, length: int, limit: int) -> None:
        self.keys = keys
        self.length = length
        self.limit = limit


def _step(w: Window, x: torch.Tensor) -> torch.Tensor:
    w.length += x.shape[0]  # the count grows, as a sliding-window layer's does
    seen = w.keys[: w.limit] * 2
    if w.length >= w.limit:  # a condition on two size symbols: a captured if
        return seen.sum(0) + x.sum(0)
    return seen.sum(0) - x.sum(0)


@pytest.mark.parametrize("target", TARGETS)
def test_int_attributes_are_sizes(target: str) -> None:
    f = cu.compile(_step, target=target, fallback="error")
    keys = torch.randn(16, 4)
    # both branches, lengths and limits all different
    for length, limit, rows in ((3, 8, 2), (4, 9, 3), (5, 12, 1), (2, 6, 2), (9, 8, 2), (7, 7, 3)):
        mine, theirs = Window(keys, length, limit), Window(keys, length, limit)
        x = torch.randn(rows, 4)
        got, want = f(mine, x), _step(theirs, x)
        torch.testing.assert_close(got, want)
        assert got.dtype == want.dtype
        # the new count reaches the caller's object as a plain int
        assert type(mine.length) is int and mine.length == theirs.length == length + rows
        assert type(mine.limit) is int
    assert f.stats.compiles == 1, f.stats.recompile_reasons


def test_zero_stays_a_value_and_one_is_a_size() -> None:
    """0 decides most branches (an empty cache): a value. 1 is a size, as a tensor dim of
    1 is: a static cache's ``batch_size`` of 1 and of 4 share a variant."""
    f = cu.compile(_step, target="reference", fallback="error")
    keys = torch.randn(16, 4)
    for length in (0, 1, 0, 3, 1):
        x = torch.randn(2, 4)
        torch.testing.assert_close(f(Window(keys, length, 8), x), _step(Window(keys, length, 8), x))
    assert f.stats.compiles == 2, f.stats.recompile_reasons
    assert "int 0" in f.stats.recompile_reasons[0] and "a size symbol" in f.stats.recompile_reasons[0]


def _take(x: torch.Tensor, n: int) -> torch.Tensor:
    return x[:n] + 1


def test_plain_int_arguments_and_static_compiles_stay_specialized() -> None:
    f = cu.compile(_take, target="reference", fallback="error")
    x = torch.randn(10, 3)
    for n in (3, 5):
        torch.testing.assert_close(f(x, n), _take(x, n))
    assert f.stats.compiles == 2
    g = cu.compile(_step, target="reference", fallback="error", dynamic=False)
    keys = torch.randn(16, 4)
    for limit in (8, 9):
        g(Window(keys, 3, limit), torch.ones(2, 4))
    assert g.stats.compiles == 2
    assert "int 8" in g.stats.recompile_reasons[0]


def _sized(w: Window) -> torch.Tensor:
    return torch.zeros(w.limit, 2) + w.keys.sum()


@pytest.mark.parametrize("target", TARGETS)
def test_a_size_from_an_int_attribute_shapes_the_result(target: str) -> None:
    f = cu.compile(_sized, target=target, fallback="error")
    for limit in (3, 7, 4):
        w = Window(torch.ones(2), 2, limit)
        out = f(w)
        assert out.shape == (limit, 2)
        torch.testing.assert_close(out, _sized(w))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert "w_limit" in cu.explain(f, Window(torch.ones(2), 2, 5))


class Options:
    def __init__(self, n: int) -> None:
        self.n = n


def _rows(x: torch.Tensor, opts: Options) -> torch.Tensor:
    out = []
    for i in range(opts.n):  # a Python loop building a list: runs unrolled, on a value
        out.append(x[i] * i)
    return torch.stack(out)


def test_code_that_needs_an_int_attribute_as_a_value_gets_one() -> None:
    """A loop over ``range(opts.n)`` that appends to a list cannot be a captured loop over
    a size: the capture is made again with the ints as values (specialized, as before),
    and they stay values for this function; ``stats.notes`` says why."""
    f = cu.compile(_rows, target="reference", fallback="error")
    x = torch.randn(8, 3)
    for n in (3, 4, 3):
        torch.testing.assert_close(f(x, Options(n)), _rows(x, Options(n)))
    assert f.stats.compiles == 2 and f.stats.fallbacks == 0, f.stats.recompile_reasons
    assert "argument opts_n: was int 3, now int 4" in f.stats.recompile_reasons[0]
    assert any("specialized by value from now on" in n for n in f.stats.notes)


def _unrolled(x: torch.Tensor, n: int) -> torch.Tensor:
    out = []
    for i in range(n):  # as _rows: needs n as a value
        out.append(x[i] * i)
    return torch.stack(out)


def test_ints_passed_as_sizes_become_values_for_good() -> None:
    """The torch.compile backend passes a symbolic int as a size (``size_arg``); once a
    capture needed the value, later calls are keyed by value too: one compile per value,
    not one per call."""
    from cuvil.frontend.arg_objects import size_arg

    f = cu.compile(_unrolled, target="reference", fallback="error")
    x = torch.randn(8, 3)
    for n in (3, 4, 3, 4):
        torch.testing.assert_close(f(x, size_arg(n)), _unrolled(x, n))
    assert f.stats.compiles == 2 and f.stats.cache_hits == 2, f.stats.recompile_reasons
    assert not f.int_sizes


def test_the_state_of_a_symbolic_int_attribute_is_its_expression() -> None:
    """While a capture runs, an int attribute is a ``torch.SymInt``; an object's state (what
    tells whether the function changed it) holds its expression, not a walk through its
    node into the shape environment (whose thousands of entries, printed, were most of a
    decoder's compile time)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from cuvil.frontend.arg_objects import state

    env = ShapeEnv()
    length = env.create_unbacked_symint()
    w = Window(torch.zeros(2), 3, 8)
    w.length = length
    got = state(w)
    assert (f"{type(w).__name__}.length", (torch.SymInt, length.node.expr)) in got
    assert len(got) == 4, got  # the object, keys, length, limit: nothing inside the symbol
    w2 = Window(torch.zeros(2), 3, 8)
    w2.length = length + 1
    assert state(w2) != got  # a new expression is a changed state
