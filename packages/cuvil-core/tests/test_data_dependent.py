"""Sizes computed from tensor data (issue 13): ``nonzero``, ``masked_select``, ``x[mask]``,
``unique``, ``argwhere``, ``int(t)``/``t.item()`` as a size, and a detection-style
post-process. Each compiles whole (``fallback="error"``) on ``reference`` and ``cpu``,
matches eager over calls with other data (other counts, none selected) and other input
sizes, with one compile. See [Note: data-dependent sizes] in cuvil_ir.graph_ir.ops.core."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil.capabilities import check_capabilities
from cuvil_ir.graph_ir.parser import parse_graph
from cuvil_ir.graph_ir.verifier import verify
from cuvil_runtime.target import Capabilities

TARGETS = [t for t in ("reference", "cpu") if t in {b.name for b in cu.backends() if b.available}]


def same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
        torch.testing.assert_close(g, w, equal_nan=True)  # the mean of no rows


def nonzero(x):
    return torch.nonzero(x > 0) + 1


def masked_select(x, m):
    return torch.masked_select(x, m) * 2


def bool_mask_rows(b, x):
    return b[x > 0].sum(-1)


def unique(x):
    return torch.unique(x) * 3


def argwhere(x):
    return torch.argwhere(x)


def int_as_size(x):
    n = int((x > 0).sum())
    return torch.zeros(n, 2) + x.max()


def item_as_size(x):
    n = (x > 0).sum().item()
    return torch.arange(n) * 2


def slice_to_count(x):
    n = int((x > 0).sum())
    v = x.sort(descending=True).values
    # bounds clamped as torch does: Min(u0, x_0), Max(Min(u0, x_0), 1) ... when it runs
    return v[:n] * 2, v[n:], v[1:n]


def post(boxes, scores, thr: float = 0.5, k: int = 3):
    keep = scores > thr
    b, s = boxes[keep], scores[keep]
    top = torch.topk(s, min(k, s.shape[0]))  # min of a data size: torch.sym_min
    return b[top.indices], top.values


def _scores(n, selected):
    """``n`` scores of which ``selected`` exceed 0.5 (the rest are below)."""
    s = torch.rand(n) * 0.4
    s[torch.randperm(n)[:selected]] = 0.6 + torch.rand(selected) * 0.4
    return s


def _signed(shape, positive):
    """A tensor with ``positive`` entries > 0 (the rest < 0), in random places."""
    x = -torch.rand(shape) - 0.1
    flat = x.view(-1)
    flat[torch.randperm(flat.numel())[:positive]] *= -1
    return x


# (function, inputs(size, count)): each call pair has other sizes and other counts
CASES = {
    "nonzero": (nonzero, lambda n, c: (_signed((n,), c),)),
    "masked_select": (masked_select, lambda n, c: (torch.randn(n, 3), _signed((n, 3), c) > 0)),
    "bool_mask_rows": (bool_mask_rows, lambda n, c: (torch.randn(n, 4), _signed((n,), c))),
    "unique": (unique, lambda n, c: (torch.randint(0, c + 1, (n,)),)),
    "argwhere": (argwhere, lambda n, c: ((_signed((n, 2), c) > 0).to(torch.int64),)),
    "int_as_size": (int_as_size, lambda n, c: (_signed((n,), c),)),
    "item_as_size": (item_as_size, lambda n, c: (_signed((n,), c),)),
    "post": (post, lambda n, c: (torch.randn(n, 4), _scores(n, c))),
    "slice_to_count": (slice_to_count, lambda n, c: (_signed((n,), c),)),
}
# (size, count): a first call, more selected at another size, none selected, one
CALLS = [(6, 4), (9, 7), (5, 0), (7, 1)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager_with_one_compile(case, target):
    fn, make = CASES[case]
    f = cu.compile(fn, target=target, fallback="error")
    for n, count in CALLS:
        args = make(n, count)
        same(f(*args), fn(*args))
    assert f.stats.compiles == 1, f.stats.recompile_reasons


@pytest.mark.parametrize("target", TARGETS)
def test_data_size_flows_through_later_ops(target):
    """A data size is one more symbol: broadcasting, reductions, reshapes and a second
    data-dependent op on it."""

    def f(x, w):
        rows = x[x.sum(-1) > 0]  # (u0, 4)
        y = torch.relu(rows @ w) * rows.shape[0]  # (u0, 3), scaled by the count
        flat = y.reshape(-1)  # (3*u0,)
        return y.mean(0), flat[flat > 0.5], y.shape[0] + 1

    g = cu.compile(f, target=target, fallback="error")
    w = torch.randn(4, 3)
    for n, c in [(6, 3), (8, 0), (5, 5)]:
        x = _signed((n, 4), 0)
        x[:c] = x[:c].abs()
        got, want = g(x, w), f(x, w)
        same(got[:2], want[:2])
        assert got[2] == want[2]
    assert g.stats.compiles == 1


def in_loop(x):
    acc = torch.zeros(())
    for i in range(x.shape[0]):  # a captured loop: bound per iteration
        acc = acc + x[i][x[i] > 0].sum() + torch.nonzero(x[i] > 0).shape[0]
    return acc


def in_branch(x):
    if x.sum() > 0:  # a tensor condition: bound in the branch that runs
        y = x[x > 0].sum()
    else:
        y = x.sum() * 2
    return y


def used_in_loop(x):
    s = x[x > 0]
    acc = torch.zeros(s.shape[0])
    for i in range(x.shape[0]):  # the loop body reads a size bound before it
        acc = acc + s * i
    return acc


def chained(x):
    idx = torch.nonzero(x > 0).squeeze(1)
    y = x[idx]
    return torch.cat([y, y * 2]), y.unsqueeze(0).expand(2, -1).contiguous()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [in_loop, in_branch, used_in_loop, chained])
def test_data_sizes_with_control_flow_and_views(fn, target):
    f = cu.compile(fn, target=target, fallback="error")
    for x in (_signed((4, 3), 5), _signed((6, 3), 11), _signed((3, 3), 0), _signed((5, 3), 15)):
        x = x if fn is in_loop else x.reshape(-1)
        same(f(x), fn(x))
    assert f.stats.compiles == 1


@pytest.mark.parametrize("target", TARGETS)
def test_topk_with_a_constant_k_checks_the_count_when_it_runs(target):
    """``topk(s, 3)`` needs ``3 <= u0``: an ``assert_size`` node, never an assumption."""

    def f(s):
        s = s[s > 0.5]
        return torch.topk(s, 3).values

    g = cu.compile(f, target=target, fallback="error")
    for s in (_scores(6, 4), _scores(7, 3), _scores(5, 5)):
        same(g(s), f(s))
    assert "assert_size() {fact = <Le(3, u0)>" in g.graphs[0].text
    with pytest.raises(RuntimeError, match="out of range"):  # torch's topk, as in eager
        g(_scores(8, 2))
    assert g.stats.compiles == 1


@pytest.mark.parametrize("target", TARGETS)
def test_runtime_fact_is_checked_not_assumed(target):
    """torch's deferred runtime assert becomes an ``assert_size`` node whose failure is an
    error when it runs (our check raises here: no torch kernel would)."""

    def f(s):
        s = s[s > 0.5]
        torch._check(s.shape[0] >= 2)
        return s * 2

    g = cu.compile(f, target=target, fallback="error")
    s = _scores(6, 3)
    same(g(s), f(s))
    assert "assert_size() {fact = <Le(2, u0)>" in g.graphs[0].text
    with pytest.raises(ValueError, match="sizes computed from tensor data"):
        g(_scores(6, 1))
    assert g.stats.compiles == 1


@pytest.mark.parametrize("target", TARGETS)
def test_negative_int_as_size_is_an_error(target):
    def f(x):
        return torch.zeros(int(x.sum()))

    g = cu.compile(f, target=target, fallback="error")
    same(g(torch.tensor([1, 2])), f(torch.tensor([1, 2])))
    with pytest.raises(ValueError, match="cannot be negative"):
        g(torch.tensor([1, -4]))


@pytest.mark.parametrize("target", TARGETS)
def test_if_on_a_data_size_is_decided_when_it_runs(target):
    def f(x):
        s = x[x > 0]
        if s.shape[0] == 3:
            return s
        return s * 2

    g = cu.compile(f, target=target, fallback="error")
    for n, c in [(6, 3), (7, 2), (5, 0), (4, 3)]:
        x = _signed((n,), c)
        same(g(x), f(x))
    assert g.stats.compiles == 1


def _reshape(x):
    s = x[x > 0]
    return s.view(s.shape[0] // 2, 2)  # needs u0 even


def _broadcast(x):
    return x[x > 0] + x[:3]  # needs u0 == 3 (or 1)


def _float(x):
    n = x[x > 0].shape[0]
    return torch.ones(n) * float(n)  # the value in Python


@pytest.mark.parametrize("fn", [_reshape, _broadcast, _float])
def test_deciding_on_a_data_size_is_a_located_error(fn):
    c = cu.compile(fn, target="reference", fallback="error")
    with pytest.raises(cu.CompileError, match="computed from tensor data") as e:
        c(torch.randn(6))
    assert e.value.loc is not None and e.value.loc.file == __file__
    assert "sym_min" in (e.value.hint or "")


def test_float_value_is_refused():
    def f(x):
        return torch.zeros(int(x.sum()))

    c = cu.compile(f, target="reference", fallback="error")
    with pytest.raises(cu.CompileError, match="(?s)`int` needs the value of a tensor.*integer tensor"):
        c(torch.randn(3))


def _graph(fn, *args):
    f = cu.compile(fn, target="reference", fallback="error")
    f(*args)
    return f.graphs[0]


def test_graph_round_trips_and_verifies():
    for name in ("post", "int_as_size", "bool_mask_rows", "slice_to_count"):
        fn, make = CASES[name]
        g = _graph(fn, *make(6, 3))
        verify(g)
        again = parse_graph(g.text)
        assert again.text == g.text and again.hash == g.hash
        verify(again)


def test_target_without_support_refuses_at_the_op():
    fn, make = CASES["bool_mask_rows"]
    g = _graph(fn, *make(6, 3))
    with pytest.raises(cu.CompileError, match="computed from tensor data") as e:
        check_capabilities(g, Capabilities(control_flow=True), "plain")
    assert e.value.loc is not None and e.value.loc.line > 0
    check_capabilities(g, Capabilities(data_dependent_sizes=True), "plain")


@pytest.mark.parametrize("target", TARGETS)
def test_saved_artifact_runs_other_counts(target, tmp_path):
    """A saved program binds its data sizes like the compiled one (nothing is fixed at save)."""
    fn, make = CASES["post"]
    f = cu.compile(fn, target=target, fallback="error")
    g = cu.load(cu.save(f, tmp_path / "post.cuvil", *make(6, 3)))
    for n, count in CALLS:
        args = make(n, count)
        same(g(*args), fn(*args))


# -- sizes that live inside one torch call (the OpInfo sweep's `narrow`, `combinations`) --


def narrow_tensor_start(x, start):
    return torch.narrow(x, 1, start, 2) * 2


@pytest.mark.parametrize("target", TARGETS)
def test_narrow_with_a_tensor_start(target):
    """torch reads the start into a size inside the call (``u0``) and checks ``u0 + 2 <=
    x.shape[1]`` there: no node of the graph binds ``u0``, so the check is the call's own
    (it runs the same code on the real value), and the result's size is the length."""
    f = cu.compile(narrow_tensor_start, target=target, fallback="error")
    for shape, start in [((5, 5, 5), 2), ((3, 7, 4), 5), ((4, 6, 2), -3), ((2, 3, 3), 0)]:
        x, s = torch.randn(shape), torch.tensor(start)
        same(f(x, s), narrow_tensor_start(x, s))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    assert "assert_size" not in f.graphs[0].text
    x = torch.randn(3, 5, 2)
    with pytest.raises(RuntimeError, match="exceeds dimension size"):  # torch's check, as in eager
        narrow_tensor_start(x, torch.tensor(4))
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        f(x, torch.tensor(4))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("r, with_replacement", [(2, False), (3, False), (2, True)])
def test_combinations(target, r, with_replacement):
    """``combinations`` masks its index grids (``masked_select``: data sizes) and stacks
    them, checking inside the call that the selections agree; the result's row count is
    bound from the result. torch's implementation reads the input's length as a plain
    int, so each length is its own compile (a guard, never a stale result)."""

    def fn(x):
        return torch.combinations(x, r=r, with_replacement=with_replacement) + 1

    f = cu.compile(fn, target=target, fallback="error")
    for n in (4, 1, 5, 4):
        x = torch.randn(n)
        same(f(x), fn(x))
    assert f.stats.compiles == 3, f.stats.recompile_reasons


def tensor_split_by_count(x, sections):
    return torch.tensor_split(x, sections)


def test_tensor_split_by_a_0d_tensor_is_a_clear_refusal():
    """The number of results would come from the tensor's value: no graph can have it."""
    f = cu.compile(tensor_split_by_count, target="reference", fallback="error")
    with pytest.raises(cu.CompileError, match="number read from a tensor argument's data") as e:
        f(torch.randn(5, 4), torch.tensor(2))
    assert e.value.loc is not None and e.value.loc.file == __file__
    assert "Python int" in str(e.value) and "verify" not in str(e.value)


@pytest.mark.parametrize("target", TARGETS)
def test_tensor_split_by_tensor_indices(target):
    """A 1-d index tensor: as many results as indices, each a data size."""
    f = cu.compile(tensor_split_by_count, target=target, fallback="error")
    for n, idx in [(5, [1, 2, 3]), (8, [0, 6, 7]), (4, [3, 3, 9])]:
        x, i = torch.randn(n, 3), torch.tensor(idx)
        same(f(x, i), tensor_split_by_count(x, i))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
