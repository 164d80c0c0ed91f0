"""``x.is_contiguous()`` in traced code answers what eager answers (cuvil/frontend/layout.py):
views, layout-keeping elementwise results, ``.contiguous()``, arguments passed transposed
(a layout guard: a call laid out otherwise recompiles), size-1 dims (a size guard), and a
clear refusal where the layout cannot be told. Each case is compared with eager, values,
dtypes and the branch taken."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

TARGETS = [t for t in ("reference", "cpu") if t in {b.name for b in cu.backends() if b.available}]


def same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
            torch.testing.assert_close(g, w)
        else:
            assert type(g) is type(w) and g == w, (got, want)


def branch_on_transpose(x):
    if x.t().is_contiguous():
        return x + 1
    return x * 3


def queries(x):
    """Views and results of each kind, asked (as eager bools) and used in a branch."""
    y = x * 2
    asked = (
        x.is_contiguous(),
        x.t().is_contiguous(),
        x.permute(1, 0).is_contiguous(),
        x[:, ::2].is_contiguous(),  # a slice with a step
        x[:, :2].is_contiguous(),  # narrow of the inner dim
        x[:2].is_contiguous(),  # narrow of the outer dim
        x.narrow(1, 0, 1).is_contiguous(),
        x.unsqueeze(0).is_contiguous(),
        x[0].is_contiguous(),
        x[:, 0].is_contiguous(),
        (x.t() * 2).is_contiguous(),  # elementwise keeps the permuted layout
        (x.t() + y.t()).is_contiguous(),
        x.t().reshape(-1).is_contiguous(),  # a copy
        (x.t() @ x).is_contiguous(),
        x.t().contiguous().is_contiguous(),
        (x.t().contiguous() + 1).is_contiguous(),
        x[:1].expand(3, -1).is_contiguous(),
        x.sum(0).is_contiguous(),
        x.t().is_contiguous(memory_format=torch.contiguous_format),
    )
    z = x.t()
    z.contiguous()  # the original keeps its layout
    out = y + (1 if z.is_contiguous() else 2)
    return (out, *asked)


@pytest.mark.parametrize("target", TARGETS)
def test_answers_match_eager(target):
    f = cu.compile(queries, target=target, fallback="error")
    for x in (
        torch.randn(3, 4),
        torch.randn(5, 6),
        torch.randn(4, 3).t(),
        torch.randn(1, 4),
        torch.randn(3, 1),
    ):
        same(f(x), queries(x))


@pytest.mark.parametrize("target", TARGETS)
def test_both_branches_and_guards(target):
    """Contiguous arguments of two sizes share one compile; a transposed argument (the
    other branch in eager) is a layout-guard miss, never the first compile's branch."""
    f = cu.compile(branch_on_transpose, target=target, fallback="error")
    x = torch.randn(3, 4)
    same(f(x), branch_on_transpose(x))
    x2 = torch.randn(6, 5)
    same(f(x2), branch_on_transpose(x2))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    xt = torch.randn(4, 3).t()  # x.t() is contiguous: the `+ 1` branch
    same(f(xt), branch_on_transpose(xt))
    assert f.stats.compiles == 2
    assert "layout guard" in f.stats.recompile_reasons[-1]
    for a in (x, xt, torch.randn(7, 2), torch.randn(2, 7).t()):  # both variants, cache hits
        same(f(a), branch_on_transpose(a))
    assert f.stats.compiles == 2


@pytest.mark.parametrize("target", TARGETS)
def test_size_one_dims_are_guarded(target):
    """A (1, n) tensor's transpose is contiguous: the answer depends on a size, which
    becomes a size guard (a recompile when it changes), not a guess."""
    f = cu.compile(branch_on_transpose, target=target, fallback="error")
    for x in (torch.randn(3, 4), torch.randn(1, 4), torch.randn(3, 1), torch.randn(2, 5), torch.randn(1, 7)):
        same(f(x), branch_on_transpose(x))
    assert f.stats.compiles <= 3, f.stats.recompile_reasons


def test_not_answered_without_eager_layout():
    """A value out of a captured `if`, a parameter, and ``x.stride()``: located refusals."""

    def from_branch(x):
        if x.sum() > 0:  # a tensor condition: a captured `if`
            y = x * 2
        else:
            y = x + 1
        return x + 1 if y.is_contiguous() else x - 1

    lin = torch.nn.Linear(3, 3)

    def param(x):
        return x + 1 if lin.weight.t().is_contiguous() else x

    def stride(x):
        return x * x.stride()[0]

    for fn, says in (
        (from_branch, "not made by a torch call"),
        (param, "not an argument"),
        (stride, "x.stride"),
    ):
        f = cu.compile(fn, target="reference", fallback="error")
        with pytest.raises(cu.CompileError, match=says) as e:
            f(torch.randn(3, 3))
        assert e.value.loc is not None and e.value.loc.file == __file__
        assert ".contiguous()" in (e.value.hint or "") or "outside the compiled function" in (
            e.value.hint or ""
        )


def test_argument_that_is_not_dense_is_refused():
    def f(x):
        return x + 1 if x.is_contiguous() else x - 1

    c = cu.compile(f, target="reference", fallback="error")
    x = torch.randn(3, 4)
    same(c(x), f(x))
    with pytest.raises(cu.CompileError, match="strided slice or an expand"):
        c(torch.randn(3, 8)[:, ::2])


def test_in_place_after_contiguous_is_refused():
    """``y = h.contiguous()`` is ``h`` itself or a copy, by layout: an in-place update of
    either would reach the other or not, so it is refused (never silently one way)."""

    def f(x):
        h = x * 2
        y = h.contiguous()
        y.mul_(2)
        return h, y

    c = cu.compile(f, target="reference", fallback="error")
    with pytest.raises(cu.CompileError, match="shares memory with a view"):
        c(torch.randn(3))


def test_saved_artifact_keeps_the_layout_guard(tmp_path):
    f = cu.compile(branch_on_transpose, target="reference", fallback="error")
    x = torch.randn(3, 4)
    g = cu.load(cu.save(f, tmp_path / "t.cuvil", x))
    x2 = torch.randn(5, 2)
    same(g(x2), branch_on_transpose(x2))
    xt = torch.randn(4, 3).t()
    try:
        got = g(xt)
    except Exception as e:  # refusing the call is fine; the other branch's result is not
        assert "layout" in str(e), e
    else:
        same(got, branch_on_transpose(xt))


def channels_last(x):
    return (
        x * 2,
        x.is_contiguous(),
        x.is_contiguous(memory_format=torch.channels_last),
        x.sum().is_contiguous(),
    )


@pytest.mark.parametrize("target", TARGETS)
def test_memory_formats_and_0d(target):
    """A channels-last argument is a permutation of a contiguous tensor: answered and
    guarded like a transposed one."""
    f = cu.compile(channels_last, target=target, fallback="error")
    x = torch.randn(2, 3, 4, 5)
    for a in (x, x.to(memory_format=torch.channels_last), torch.randn(3, 2, 2, 3)):
        same(f(a), channels_last(a))
    assert f.stats.compiles == 2, f.stats.recompile_reasons


def test_sizes_computed_from_data():
    """A 1-d selection is contiguous whatever its length; its transpose's answer needs
    the count (== 1?), which no capture has: a located refusal, not a guess."""

    def rows(x):
        r = x[x > 0]
        return r * 2, r.is_contiguous()

    def cols(x):
        r = x[x.sum(-1) > 0]
        return r.t().is_contiguous()

    f = cu.compile(rows, target="reference", fallback="error")
    for x in (torch.randn(6), torch.ones(1), -torch.ones(3)):
        same(f(x), rows(x))
    g = cu.compile(cols, target="reference", fallback="error")
    with pytest.raises(cu.CompileError, match="computed from tensor data") as e:
        g(torch.randn(5, 4))
    assert e.value.loc is not None and e.value.loc.file == __file__
