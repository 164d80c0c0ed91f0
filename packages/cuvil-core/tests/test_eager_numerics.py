"""Numerics where a lowering used to differ from eager (issue 26, item 9).

* Unary ops eager refuses on a bool tensor (``abs``, ``neg``, ``floor``, ``relu``, ...)
  are refused at capture with eager's message: eager's error under the default
  fallback, a located CompileError under ``fallback="error"``.
* Float ``//`` follows ATen's ``div_floor_floating`` (``inf // 2`` is nan, ``-1 // inf``
  is -1, zero quotients keep their sign); ``%`` and integer ``//`` were already eager's.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu

TARGETS = sorted(b.name for b in cu.backends() if b.available)
BOOL_REFUSED = {
    "abs": torch.abs,
    "neg": torch.neg,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "trunc": torch.trunc,
    "relu": torch.relu,
    "silu": F.silu,
    "hardswish": F.hardswish,
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(BOOL_REFUSED))
def test_unary_on_bool_refused_like_eager(name, target):
    op = BOOL_REFUSED[name]

    def fn(x):
        return op(x)

    mask = torch.tensor([True, False, True])
    with pytest.raises((RuntimeError, NotImplementedError)) as eager:
        fn(mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cu.CuvilFallbackWarning)
        with pytest.raises(type(eager.value), match="Bool|bool"):
            cu.compile(fn, target=target)(mask)
    with pytest.raises(cu.CompileError, match=f"{name}\\(\\) on a bool tensor") as located:
        cu.compile(fn, target=target, fallback="error")(mask)
    assert "test_eager_numerics.py" in str(located.value) and "hint:" in str(located.value)
    # other dtypes still compile, to eager's values
    x = torch.tensor([-1.5, 0.25, 2.0])
    torch.testing.assert_close(cu.compile(fn, target=target, fallback="error")(x), fn(x))


@pytest.mark.parametrize("target", TARGETS)
def test_unary_on_bool_that_eager_accepts_still_compiles(target):
    def fn(x):
        return torch.sign(x), torch.logical_not(x), ~x, torch.exp(x)

    mask = torch.tensor([True, False])
    for got, want in zip(cu.compile(fn, target=target, fallback="error")(mask), fn(mask), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


SPECIAL_A = [math.inf, -math.inf, 1.0, -1.0, 0.0, -0.0, 5.0, -5.0, math.nan, 7.5, -7.5, 1e30]
SPECIAL_B = [2.0, -2.0, math.inf, -math.inf, 0.0, -0.0, math.nan, 0.5, 3.0]


def floordiv(a, b):
    return a // b


def remainder(a, b):
    return a % b


def assert_same_bits(got, want):
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    both_nan = got.isnan() & want.isnan()
    assert torch.equal(got.signbit() | both_nan, want.signbit() | both_nan), (got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [floordiv, remainder])
def test_float_floordiv_and_remainder_match_eager_at_inf_nan_zero(fn, dtype, target):
    a = torch.tensor(SPECIAL_A, dtype=dtype)[:, None].expand(-1, len(SPECIAL_B)).contiguous()
    b = torch.tensor(SPECIAL_B, dtype=dtype)[None, :].expand(len(SPECIAL_A), -1).contiguous()
    f = cu.compile(fn, target=target, fallback="error")
    assert_same_bits(f(a, b), fn(a, b))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, generator=g, dtype=dtype) * 100, torch.randn(512, generator=g, dtype=dtype) * 3
    assert_same_bits(f(x, y), fn(x, y))
    # a scalar divisor goes through the same lowering
    h = cu.compile(lambda t: t // 2.0, target=target, fallback="error")
    assert_same_bits(h(a[:, 0].contiguous()), a[:, 0] // 2.0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("fn", [floordiv, remainder])
def test_integer_floordiv_and_remainder_negative_operands(fn, dtype, target):
    a = torch.arange(-9, 10, dtype=dtype)[:, None].expand(-1, 6).contiguous()
    b = torch.tensor([-4, -3, -1, 1, 3, 4], dtype=dtype)[None, :].expand(19, -1).contiguous()
    got = cu.compile(fn, target=target, fallback="error")(a, b)
    assert got.dtype == dtype
    assert torch.equal(got, fn(a, b))
