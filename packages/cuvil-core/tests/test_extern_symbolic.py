"""The extern path under symbolic sizes (issue 13): ops without a Cuvil declaration get
their output types from torch's Python meta kernels and decompositions (the python
dispatcher), torch operator overloads and data attributes are nameable externs, and
metadata queries are answered from the IR type, never counted as data. Every program
runs on every installed target at two sizes with one compile."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil.errors import CompileError

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def diag(x):
    return torch.diag(x) + 1


def trace(x):
    return torch.trace(x) * 2


def diag_embed_of_diag(x):
    return torch.diag(torch.diag(x))  # a vector's diag: a square matrix


def aten_slice(x):
    return torch.ops.aten.slice.Tensor(x, 0, 1, 3)


def aten_packet(x):
    return torch.ops.aten.slice(x, 1, 0, 2) * 3


def aten_inplace(x):
    y = x.clone()
    torch.ops.aten.add_.Tensor(y, x)
    return y


def complex_parts(x):
    z = torch.view_as_complex(torch.stack([x, x * 2], -1))
    return z.real + z.imag


def is_floating_point(x):
    return x * 2 if torch.is_floating_point(x) else x - 1


def method_queries(x):
    if x.is_floating_point() and not x.is_complex() and x.is_signed() and not torch.is_complex(x):
        return x + 1
    return x


def numel(x):
    return x.reshape(torch.numel(x)) / x.numel() + x.nbytes / x.itemsize


def result_type(x):
    return x.to(torch.result_type(x, 2.5)) + torch.ones((), dtype=torch.result_type(1, x))


def same_size(x):
    # x[1:] is never x's size: decided once for every size, no recompile
    if torch.is_same_size(x, x * 2) and x.is_same_size(x) and not torch.is_same_size(x, x[1:]):
        return x + 1
    return x


PROGRAMS = [
    diag,
    trace,
    diag_embed_of_diag,
    aten_slice,
    aten_packet,
    aten_inplace,
    complex_parts,
    is_floating_point,
    method_queries,
    numel,
    result_type,
    same_size,
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_matches_eager_at_two_sizes(fn, dtype, target) -> None:
    if dtype == torch.int64 and fn in (complex_parts, trace):
        pytest.skip("float-only op")
    f = cu.compile(fn, target=target, fallback="error")
    for n in (4, 6):
        x = torch.arange(n * n).reshape(n, n).to(dtype) - 3
        got, want = f(x), fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert f.stats.compiles == 1


def test_the_symbolic_size_stays_symbolic() -> None:
    # diag's output length is the input's size, not the example's: one artifact serves both
    f = cu.compile(diag, target="reference", fallback="error")
    f(torch.randn(3, 3))
    assert f(torch.randn(5, 5)).shape == (5,)
    assert f.stats.compiles == 1


def test_a_data_attribute_is_not_metadata() -> None:
    # `x.real` is read from the tensor at run time: a new value gives a new result
    f = cu.compile(complex_parts, target="reference", fallback="error")
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    torch.testing.assert_close(f(a), complex_parts(a))
    torch.testing.assert_close(f(b), complex_parts(b))


def test_a_value_query_is_still_refused() -> None:
    def f(x):
        return x + 1 if torch.is_nonzero(x.sum()) else x

    with pytest.raises(CompileError):
        cu.compile(f, target="reference", fallback="error")(torch.ones(2))


@pytest.mark.parametrize("target", TARGETS)
def test_a_size_result_is_a_torch_size(target) -> None:
    def f(x):
        return x + 1, x.shape, torch.broadcast_shapes((2, 1), (1, 3))

    c = cu.compile(f, target=target, fallback="error")
    for n in (2, 5):
        _, shape, const = c(torch.ones(n, 3))
        assert type(shape) is torch.Size and shape == (n, 3)
        assert type(const) is torch.Size and const == (2, 3)
    assert c.stats.compiles == 1
