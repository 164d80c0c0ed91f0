"""Regression tests for what the differential fuzzer (test_fuzz.py) found, each
minimized to a few lines, on every installed target, with a second call at other
sizes (docs/testing.md lists the findings)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def check(fn, *arg_sets, target):
    f = cu.compile(fn, target=target, fallback="error")
    for args in arg_sets:
        got, want = f(*args), fn(*args)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w)


# -- a negative slice start past the beginning of a symbolic dim ----------------------
# `x[-3:]` of a dim of size 2 starts at 0; the cpu lowering started at x_0 - 3 (= -1)
# and read before the tensor (garbage values).
def tail3(x):
    return x[-3:] * 1


def tail2_of_row(x):
    return F.mish(x)[-1, -2:]


def tail2_dim1(x):
    return x[:, -2:] + 0


@pytest.mark.parametrize("target", TARGETS)
def test_negative_slice_start_clamps_to_zero(target):
    check(tail3, (torch.arange(2.0),), (torch.arange(1.0),), target=target)
    check(
        tail2_of_row,
        (torch.randn(5, 1, dtype=torch.float64),),
        (torch.randn(4, 1, dtype=torch.float64),),
        target=target,
    )
    check(tail2_dim1, (torch.randn(3, 1),), (torch.randn(2, 1),), target=target)
    check(tail3, (torch.arange(5.0),), (torch.arange(7.0),), target=target)  # no clamping


# -- float16/bfloat16 values a kernel would have to copy -------------------------------
# Kernels do not hold f16/bf16, but the copy of an input returned as an output, or of a
# value returned twice, was still made by a kernel: KeyError in the C generator.
def return_twice(x):
    v = x.sum(dim=-1, keepdim=True).expand(x.shape)
    return v, v[...]


def return_input(x):
    return x.contiguous()


def return_input_and_value(x):
    return x, x.transpose(0, 1) * 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_outputs_are_copied_without_a_kernel(target, dtype):
    check(return_twice, (torch.randn(5, 3).to(dtype),), (torch.randn(0, 3).to(dtype),), target=target)
    check(return_input, (torch.randn(4, 2).to(dtype),), (torch.randn(4, 2).to(dtype).t(),), target=target)
    check(
        return_input_and_value, (torch.randn(3, 2).to(dtype),), (torch.randn(5, 4).to(dtype),), target=target
    )


def conv_bf16(x, w):
    return F.conv2d(x, w)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_conv_output(target):
    x, w = torch.randn(1, 3, 6, 6).bfloat16(), torch.randn(4, 3, 3, 3).bfloat16()
    check(conv_bf16, (x, w), target=target)


# -- broadcasting learnt inside a branch on a size --------------------------------------
# In the else branch of `if x0.size(0) == 1`, `x1 + x0` broadcasts x1's dims of size 1;
# the facts saying so are conditional on the branch (`Eq(x0_0, 1) | Eq(x1_1, 1)`), and
# the cpu lowering ignored them: it indexed x1 as if its dims were x0's.
def size_branch_broadcast(x0, x1, x2):
    if x0.size(0) == 1:
        v = x2 * 2
    else:
        v = x1 + x0
    return v


def size_branch_where(x0, x1, x2):
    if x0.size(0) == 1:
        v = x2[[1, 0, 1], :]
    else:
        v = torch.where(x1 > x0, x1, x0)
    return v


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [size_branch_broadcast, size_branch_where], ids=lambda f: f.__name__)
def test_broadcast_facts_of_a_size_branch(fn, target):
    g = torch.Generator().manual_seed(0)
    a = (
        torch.randn(5, 8, generator=g)[:, ::2],
        torch.randn(4, 1, 1, dtype=torch.float64, generator=g),
        torch.randn(5, 1, 8, dtype=torch.float64, generator=g)[..., ::2],
    )
    b = (
        torch.randn(3, 1),
        torch.randn(1, 1, 7, dtype=torch.float64),
        torch.randn(3, 7, 1, dtype=torch.float64),
    )
    check(fn, a, b, target=target)


# -- a one-output `split` ---------------------------------------------------------------
# `chunk(2)` of a size-1 dim gives one chunk: the op's reference returns a 1-tuple, and
# the cpu wrapper wrapped it in another tuple ('tuple' object has no attribute ...).
def first_chunk(x):
    v = x.chunk(2, -1)[0]
    return torch.sin(v), v


@pytest.mark.parametrize("target", TARGETS)
def test_one_output_split(target):
    check(
        first_chunk,
        (torch.randn(2, 1, dtype=torch.bfloat16),),
        (torch.randn(3, 1, dtype=torch.bfloat16),),
        target=target,
    )
    check(first_chunk, (torch.randn(2, 1),), (torch.randn(3, 4),), target=target)


# -- derived sizes and scalar arguments in one kernel -------------------------------------
# A kernel taking both a derived size (here a Piecewise from an `if` on a size) and a
# scalar argument was called with the scalars before the derived sizes, against its C
# signature: a ctypes error when their types differed, swapped values when they agreed.
def while_over_piecewise(x0):
    if x0.shape[0] > 2:
        v1 = x0.narrow(0, 0, 1)
    else:
        v1 = x0[1:]
    v2 = v1 * 1
    v3 = torch.zeros((), dtype=torch.int64)
    while (v3 < 4) & (v2.sum() < 1e4):
        v2 = v2 * 2 + 1
        v3 = v3 + 1
    return v2, v3


def scaled_tail(x, k: int):
    if x.shape[0] > 3:
        v = x[:2]
    else:
        v = x[1:]
    return v.sum() * k + v.shape[0]


@pytest.mark.parametrize("target", TARGETS)
def test_derived_sizes_and_scalars_in_one_kernel(target):
    check(
        while_over_piecewise, (torch.randn(4, 3),), (torch.randn(2, 3),), (torch.randn(5, 2),), target=target
    )
    check(scaled_tail, (torch.randn(5, 2), 3), (torch.randn(3, 2), 3), target=target)
