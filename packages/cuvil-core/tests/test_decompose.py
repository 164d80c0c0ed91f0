"""Calls with no Cuvil declaration, captured through torch's Python references into
declared ops ([Note: decompositions] in cuvil/frontend/decompose.py), or rolled back
to one extern node when a reference needs something undeclared. Every program runs
on every installed target at two sizes with one compile, against eager (values and
dtypes), and the graph is checked for what it should hold."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def lerp(x, y, w):
    return torch.lerp(x, y, w) * 2


def lerp_scalar_weight(x, y, w):
    return x.lerp(y, 0.25) + w


def addcmul(x, y, w):
    return torch.addcmul(x, y, w, value=0.5)


def addcdiv(x, y, w):
    return torch.addcdiv(x, y, w + 2, value=-1.5)


def xlogy(x, y, w):
    return torch.xlogy(w, y.abs())


def float_power(x, y, w):
    return torch.float_power(w + 1, 2)  # float64, as eager


def logaddexp(x, y, w):
    return torch.logaddexp(x, y) - torch.logaddexp2(x, w)


def clamp_and_frac(x, y, w):
    return torch.frac(x * 3) + torch.deg2rad(y)


PROGRAMS = [lerp, lerp_scalar_weight, addcmul, addcdiv, xlogy, float_power, logaddexp, clamp_and_frac]


def _ops(compiled):
    (graph,) = compiled.graphs
    return [n.op if n.op != "extern" else f"extern:{n.attr('target')}" for n in graph.nodes]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_decomposed_into_declared_ops(fn, target) -> None:
    f = cu.compile(fn, target=target, fallback="error")
    for n in (3, 6):
        g = torch.Generator().manual_seed(n)
        x, y, w = (torch.randn(n, 5, generator=g) for _ in range(3))
        got, want = f(x, y, w), fn(x, y, w)
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert f.stats.compiles == 1
    assert not [op for op in _ops(f) if op.startswith("extern")], _ops(f)


def test_a_reference_that_needs_an_undeclared_op_rolls_back_whole() -> None:
    # torch.trace's reference calls torch.diagonal, which Cuvil does not declare: the
    # call is one extern node and nothing the attempt recorded is left behind
    f = cu.compile(lambda x: torch.trace(x), target="reference", fallback="error")
    x = torch.randn(4, 4)
    torch.testing.assert_close(f(x), torch.trace(x))
    assert _ops(f) == ["extern:torch.trace"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_clone_is_a_copy(target) -> None:
    # clone is a new handle on the same value: updating it in place leaves the original
    def fn(x):
        y = x * 2
        z = y.clone()
        z.add_(1)
        z[0] = 0.0
        return y, z

    f = cu.compile(fn, target=target, fallback="error")
    for n in (2, 5):
        x = torch.randn(n, 3)
        for got, want in zip(f(x), fn(x)):
            torch.testing.assert_close(got, want)
    assert f.stats.compiles == 1


@pytest.mark.parametrize("target", TARGETS)
def test_integer_division_primitive_truncates(target) -> None:
    # prims.div rounds integer quotients toward zero (torch.div would divide exactly)
    def fn(a, b):
        return torch.ops.prims.div.default(a, b), torch.ops.prims.div.default(a.float(), b.float())

    f = cu.compile(fn, target=target, fallback="error")
    a = torch.tensor([7, -7, 7, -7, 0])
    b = torch.tensor([2, 2, -2, -2, 3])
    for got, want in zip(f(a, b), fn(a, b)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_primitive_reductions(target) -> None:
    # prims.sum(x, []): torch's kernel reduces every dimension, its meta function none;
    # that call stays extern (eager's answer), the others are declared reductions
    def fn(x):
        return (
            torch.ops.prims.sum.default(x, []),
            torch.ops.prims.amax.default(x, [0, 1]),
            torch.ops.prims.prod.default(x, [1, 0]),
            torch.ops.prims.var.default(x, [1], 0.0),
        )

    f = cu.compile(fn, target=target, fallback="error")
    x = torch.randn(3, 4)
    for got, want in zip(f(x), fn(x)):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert [op for op in _ops(f) if op.startswith("extern")] == ["extern:torch.ops.prims.sum.default"]
