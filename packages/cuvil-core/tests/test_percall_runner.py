"""The per-call work of the generated wrapper (cuvil_runtime/runner.py): outputs
allocated on cpu without torch.empty's parsing, sizes computed once per binding,
no plan lookup when nothing uses it, no bindings dict for regions that bind their
own sizes. Values and dtypes against eager, at several sizes of one compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import cuvil as cu
from cuvil_runtime import runner as runner_module

pytest.importorskip("cuvil_backend_cpu")
from cuvil_backend_cpu.testing import executable_of  # noqa: E402


def close(a, b):
    torch.testing.assert_close(a, b)
    assert a.dtype == b.dtype


def cpu(fn):
    try:
        return cu.compile(fn, target="cpu", fallback="error")
    except Exception as e:  # no C compiler here: the cpu target is unavailable
        pytest.skip(f"cpu target unavailable: {e}")


def test_empty_cpu_and_its_fallback_agree():
    for shape, strides, dtype in [
        ((), (), torch.float32),
        ((0, 3), (3, 1), torch.int64),
        ((2, 5), (5, 1), torch.bool),
    ]:
        for make in (runner_module._empty_cpu, runner_module._empty_cpu_fallback):
            t = make(shape, strides, dtype)
            assert t.shape == shape and t.stride() == strides and t.dtype == dtype
            assert t.device.type == "cpu" and not t.requires_grad


def test_the_fallback_allocation_runs_programs(monkeypatch):
    # a torch without inductor's entry: programs generated then allocate with empty_strided
    monkeypatch.setattr(runner_module, "_empty_cpu", runner_module._empty_cpu_fallback)
    f = cpu(lambda x, y: torch.relu(x * y) + 1)
    for n in (5, 9):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        close(f(x, y), torch.relu(x * y) + 1)
    assert "_empty_cpu" in executable_of(f).stages["wrapper"]


def test_outputs_stay_on_cpu_under_another_default_device():
    f = cpu(lambda x, y: x * y + 2)
    x, y = torch.randn(6), torch.randn(6)
    close(f(x, y), x * y + 2)
    torch.set_default_device("meta")
    try:
        out = f(x, y)  # a hit: the kernel writes a cpu tensor, not a meta one
    finally:
        torch.set_default_device(None)
    assert out.device.type == "cpu"
    close(out, x * y + 2)


def test_no_plan_lookup_when_nothing_uses_it():
    f = cpu(lambda x, y: x + y)
    for n in (4, 11):
        x, y = torch.randn(n), torch.randn(n)
        close(f(x, y), x + y)
    assert "_self.plan" not in executable_of(f).stages["wrapper"]
    assert f.stats.compiles == 1


def test_sizes_that_are_expressions_come_from_the_plan():
    def g(x):
        return torch.nn.functional.avg_pool2d(x, 2) * 2 + 1  # floor(h/2), floor(w/2)

    f = cpu(g)
    for h, w in ((8, 6), (7, 9), (5, 5), (8, 6)):
        x = torch.randn(2, 3, h, w)
        close(f(x), g(x))
    assert f.stats.compiles == 1


def test_many_size_bindings_evict_plans():
    def g(x):
        return (x.softmax(-1) * 2).sum(0)  # temporaries in the arena: a plan per size

    f = cpu(g)
    sizes = list(range(1, runner_module._PLANS_KEPT + 6)) + [3, 1]
    for n in sizes:
        x = torch.randn(n, 7)
        close(f(x), g(x))
    assert f.stats.compiles == 1


def test_regions_with_and_without_bindings():
    # the regions bind every size from their inputs: the bindings are passed as they are
    def branch(x, y):
        if x.size(0) > 2:
            x = torch.nn.functional.interpolate(x, scale_factor=0.5)
        return x.mean((2, 3)) + y.sum()

    f = cpu(branch)
    for b in (4, 1, 3, 2):
        x, y = torch.randn(b, 3, 8, 6), torch.randn(5)
        close(f(x, y), branch(x, y))
    assert f.stats.compiles == 1
    assert "_c_c0(_b, " in executable_of(f).stages["wrapper"]

    # the regions read a size none of their inputs has (y_0): a bindings dict is made
    def sized(x, y):
        if x.sum() > 0:
            z = torch.arange(y.shape[0]).float() + 1
        else:
            z = torch.zeros(y.shape[0])
        return z * 2

    g = cpu(sized)
    for sign, n in ((1, 5), (-1, 5), (1, 8), (-1, 3)):
        x, y = sign * torch.rand(3, 4) + sign, torch.randn(n)
        close(g(x, y), sized(x, y))
    assert g.stats.compiles == 1
    assert "_nb = {**_b" in executable_of(g).stages["wrapper"]

    def loop(x, y):
        while x.sum() < 100:
            x = x * 2 + torch.zeros(y.shape[0]).sum() + 1
        return x

    h = cpu(loop)
    for n, m in ((3, 6), (5, 2)):
        x, y = torch.rand(n), torch.randn(m)
        close(h(x, y), loop(x, y))
    assert h.stats.compiles == 1


def _same_plan(runner, key):
    """The compiled plan ([Note: compiled size plans]) against make_plan's, field by field."""
    from cuvil_runtime.size_plan import make_plan

    b = dict(zip(runner.symbols, key))
    got = runner._plans(b)
    want = make_plan(runner.program, runner.kernels, runner.late, runner._alloc_in_plan, b)
    assert got.arena.numel() >= want.arena.numel()
    assert got.temps.keys() == want.temps.keys()
    for name, t in got.temps.items():
        w = want.temps[name]
        assert (t.dtype, t.shape, t.stride()) == (w.dtype, w.shape, w.stride()), name
        assert t.data_ptr() - got.arena.data_ptr() == w.data_ptr() - want.arena.data_ptr(), name
        assert got.ptrs[name] == t.data_ptr()
    assert got.derived == want.derived
    assert got.attrs == want.attrs
    assert got.alloc == want.alloc
    return got


@pytest.mark.parametrize(
    "fn, shapes",
    [
        # floor(h/2) sizes, temporaries in the arena
        (lambda x: torch.nn.functional.avg_pool2d(x.softmax(-1), 2) * 2 + 1, [(2, 3, 8, 6), (1, 2, 7, 9)]),
        # a size-valued attribute (view) and a float computed from a size (the scale)
        (lambda x: (x.view(x.shape[0], -1, 4) * x.shape[-1] ** -0.5).softmax(-1).sum(1), [(3, 8), (5, 12)]),
        # an extern attribute that is a size expression (k)
        (lambda x: torch.topk(x.softmax(-1), x.shape[-1] // 2).values * 2, [(4, 6), (3, 9)]),
        # a matmul (an extern) between kernels
        (lambda x: (x.relu() @ x.t()).softmax(-1) + x.sum(), [(4, 6), (7, 3)]),
    ],
)
def test_compiled_plans_equal_make_plans(fn, shapes):
    f = cpu(fn)
    for shape in shapes:
        x = torch.randn(*shape)
        close(f(x), fn(x))
    runner = executable_of(f)._runner
    keys = list(runner._local.plans)
    assert keys
    for key in keys:
        _same_plan(runner, key)
    assert runner._plans.source.startswith("def numbers(")


def test_expressions_not_printed_exactly_are_evaluated_in_the_function(monkeypatch):
    from cuvil_runtime import size_plan

    def unprintable(*args):
        raise TypeError("not printable")

    monkeypatch.setattr(size_plan, "exact_code", unprintable)
    fn = lambda x: torch.nn.functional.avg_pool2d(x.softmax(-1), 2) * x.shape[-1] ** -0.5  # noqa: E731
    f = cpu(fn)
    for shape in ((2, 3, 8, 6), (1, 2, 7, 9)):
        x = torch.randn(*shape)
        close(f(x), fn(x))
    runner = executable_of(f)._runner
    assert "_ev(_E[" in runner._plans.source and "_num(" not in runner._plans.source
    for key in list(runner._local.plans):
        _same_plan(runner, key)


def test_a_plan_the_function_cannot_make_is_made_by_make_plan(monkeypatch):
    f = cpu(lambda x: (x.softmax(-1) * 2).sum(0))
    x = torch.randn(5, 7)
    close(f(x), (x.softmax(-1) * 2).sum(0))
    runner = executable_of(f)._runner
    calls = []
    real = runner._plans._reference

    def reference(b):
        calls.append(b)
        return real(b)

    def broken(*args):
        raise ZeroDivisionError("as a size expression dividing by a zero size would")

    monkeypatch.setattr(runner._plans, "_reference", reference)
    monkeypatch.setattr(runner._plans, "_code", dataclasses.replace(runner._plans._code, numbers=broken))
    y = torch.randn(9, 7)
    close(f(y), (y.softmax(-1) * 2).sum(0))
    assert calls
