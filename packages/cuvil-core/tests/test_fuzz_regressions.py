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


# -- arithmetic on bools ---------------------------------------------------------------
# bools are 0/1 bytes in C kernels: `true + true` must be true (torch's add of bools is
# a logical or), but the cpu kernel stored 2, which a later cast read back as 2.
def bool_add_then_scale(x1):
    v4 = torch.ones_like(x1) + x1
    return v4 * 2, torch.stack([v4, v4 * 2], dim=0)


@pytest.mark.parametrize("target", TARGETS)
def test_bool_add_stays_bool(target):
    check(bool_add_then_scale, (torch.rand(2, 3) > 0.5,), (torch.rand(6, 5) > 0.5,), target=target)


# -- a size branch whose condition is decided by the graph's facts ----------------------
# The branch facts were computed with sympy calls on a condition that had become a
# plain Python bool: an internal AttributeError ('bool' object has no attribute 'xreplace').
def bool_branches(x0):
    v1 = x0.to(dtype=torch.bool)
    if x0.numel() > 8:
        v3 = torch.minimum(v1, v1)
    else:
        v3 = ~v1
    v4 = torch.add(v3, v3, alpha=2)
    return v4 <= v1, v1


@pytest.mark.parametrize("target", TARGETS)
def test_size_branch_on_a_decided_condition(target):
    check(bool_branches, (torch.randn(1),), (torch.randn(4),), target=target)
    check(bool_branches, (torch.randn(9),), (torch.randn(12),), target=target)


# -- sizes with rationals, computed in floats -------------------------------------------
# chunk(3) of 7 rows has pieces of ceil(7/3) = 3, written floor(x/3 + 2/3); the cpu
# wrapper and the size guards evaluated that in floats, floor(2.9999999999999996) = 2:
# pieces of (2, 2, 3) instead of (3, 3, 1), silently. Found while fixing the next one.
def three_chunks(x):
    a, b, c = x.chunk(3, 0)
    return a + 1, b * 2, c - 1


# -- chunk of an empty dim ----------------------------------------------------------------
# torch gives `chunks` empty pieces; the piece count ceil(n / ceil(n / chunks)) divided by
# zero (an internal error at capture; ZeroDivisionError in the guard of another size).
def chunk_any(x):
    return x.chunk(3, 0)


@pytest.mark.parametrize("target", TARGETS)
def test_chunk_sizes_are_exact_and_empty_dims_work(target):
    check(three_chunks, (torch.randn(7, 2),), (torch.randn(8, 2),), (torch.randn(9, 3),), target=target)
    f = cu.compile(chunk_any, target=target, fallback="error")
    for n in (7, 0, 5, 1, 2, 0, 9, 4):
        x = torch.randn(n, 2)
        got, want = f(x), chunk_any(x)
        assert len(got) == len(want), n
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)


# -- a fact learnt in one branch of a size `if` leaking out of it -----------------------
# In the else branch torch learnt x1_3 == 1 and replaced the symbol by 1 everywhere, so
# `v4.shape[-1]` after the `if` (x1_3 in the then branch) was the constant 1: a wrong
# shape, unguarded, for every call taking the then branch.
def branch_fact_leak(x1):
    if x1.shape[2] > 2:
        v4 = x1 + 1
    else:
        v4 = x1[::2, [-1]]
    return v4.new_zeros(v4.shape[-1]) + 1


@pytest.mark.parametrize("target", TARGETS)
def test_branch_facts_stay_in_their_branch(target):
    check(branch_fact_leak, (torch.randn(3, 3, 1, 1),), (torch.randn(6, 6, 4, 4),), target=target)
    check(branch_fact_leak, (torch.randn(6, 6, 4, 4),), (torch.randn(3, 3, 1, 1),), target=target)


# -- a view whose size divides a product of floors -----------------------------------------
# `v3.view(-1, v3.shape[-1])` with v3 of shape (d, d), d = x_1 - floor(x_0/2): the shape
# rule asked sympy whether Mod(d**2, d) is 0 in a form sympy's expand never finishes
# on; the compile hung.
def view_of_square(x0):
    v1 = x0[::2, x0.shape[0] // 2 :]
    v2 = v1[0]
    v3 = v2 @ v2.transpose(-1, -2)
    return v3.view(-1, v3.shape[-1]) / 3


@pytest.mark.parametrize("target", TARGETS)
def test_view_of_a_square_of_floors_compiles(target):
    check(view_of_square, (torch.randn(5, 4, 1),), (torch.randn(7, 5, 1),), target=target)


# -- a size merged from an `if` that broadcasts ---------------------------------------------
# `v2` is (n, 1) in one branch and (n, n) in the other; `x <= v2` broadcasts its last dim
# when it is 1. The graph assumed Eq(Piecewise(...), 1), but the lowering only used facts
# about plain symbols, so the kernel walked v2's last dim as if it were n long (wrong
# values, reads past the end).
def merged_dim_broadcasts(x0):
    if x0.shape[0] > 2:
        v2 = torch.ones(x0.shape[0], 1) * x0.sum()
    else:
        v2 = x0 * 1
    v3 = x0 <= v2
    return v3.long().amax(dim=1) * v3


@pytest.mark.parametrize("target", TARGETS)
def test_merged_size_broadcasts(target):
    check(
        merged_dim_broadcasts,
        (torch.randn(4, 4).t() * 3,),
        (torch.randn(7, 7) * 3,),
        (torch.randn(2, 2),),
        target=target,
    )


# -- conditions over sizes merged from `if`s -------------------------------------------------
# sympy writes a condition over Piecewise sizes with ITE, which our size parser did not
# know (internal TypeError); torch's symbolic sizes cannot hold an ITE at all, which
# must be a clear "unsupported" error, not an internal KeyError; and a symbol torch first
# met inside a branch lost its range when the branch's facts were undone.
def ite_condition(x0):
    if x0.shape[0] > 2:
        v1 = x0.narrow(-1, 0, 1)
    else:
        v1 = x0[-2:, x0.shape[0] // 2 :, ...]
    if v1.shape[0] % 2 == 0:
        v5 = F.hardtanh(x0)
    else:
        v5 = v1 * 0.5 + 1.0
    if v5.shape[1] > 2:
        v9 = v5.mean(dim=-1, keepdim=True)
    else:
        v9 = v5.sum(dim=-1, keepdim=True).expand(v5.shape)
    return F.layer_norm(v9, v9.shape[-1:], eps=1e-3)


def ite_into_torch(x1):
    if x1.shape[1] % 2 == 0:
        v3 = x1 @ x1
    else:
        v3 = x1[[-1], x1.shape[0] // 2 :]
    if v3.shape[1] % 2 == 0:
        v4 = x1[:-1]
    else:
        v4 = torch.where(v3 > v3, v3, v3)
    if v3.numel() > 8:
        v5 = F.layer_norm(v4, v4.shape[-1:])
    else:
        v5 = torch.where(v4 > v4, v4, v4)
    v6 = torch.reciprocal(v5 + 3.0)
    v7 = torch.add(v6, v5, alpha=2)  # an extern call: torch's symbolic sizes see the ITE
    if v3.shape[0] % 2 == 0:
        v10 = torch.sqrt(v6)
    else:
        v10 = x1 + torch.arange(x1.shape[-1])
    return v10, v7


def symbol_first_seen_in_a_branch(x0, x2):
    if x0.shape[0] > 2:
        v3 = torch.log1p(x2.abs())
    else:
        v3 = x2[:-1, x2.shape[0] // 2 :, :-1]
    v5 = x0[:-1, 0, :].amin(dim=-1)
    if x2.shape[2] % 2 == 0:
        v8 = F.rms_norm(v5, [v5.shape[-1]])
    else:
        v8 = v5[1:]
    return v8 * 2, v3.sum()


@pytest.mark.parametrize("target", TARGETS)
def test_conditions_over_merged_sizes(target):
    check(ite_condition, (torch.randn(2, 1, 2),), (torch.randn(4, 3, 2),), target=target)
    check(symbol_first_seen_in_a_branch, (torch.randn(5, 1, 5), torch.randn(3, 5, 5)), target=target)
    f = cu.compile(ite_into_torch, target=target, fallback="error")
    with pytest.raises(cu.CompileError, match="torch cannot compute with the size") as info:
        f(torch.randn(2, 2))
    assert "internal error" not in str(info.value)
    g = cu.compile(ite_into_torch, target=target)  # the default fallback: eager's result
    x = torch.randn(2, 2)
    with pytest.warns(cu.CuvilFallbackWarning):
        torch.testing.assert_close(g(x), ite_into_torch(x))


# -- repeat of an empty dim -------------------------------------------------------------
# The cpu lowering indexed the source with Mod(i, 0) when the graph pinned the dim to 0
# (internal ZeroDivisionError); no element is read, so index 0 stands in.
def repeat_empty(x0, x2):
    v1 = x0 / (x2.abs() + 1)
    return v1[1::2, 0].repeat(2)


@pytest.mark.parametrize("target", TARGETS)
def test_repeat_of_an_empty_dim(target):
    check(
        repeat_empty, (torch.randn(1, 5), torch.randn(1)), (torch.randn(1, 3), torch.randn(1)), target=target
    )
    check(
        repeat_empty, (torch.randn(4, 5), torch.randn(1)), (torch.randn(1, 3), torch.randn(1)), target=target
    )


# -- a load hoisted out of the arm that guards it ------------------------------------------
# pad's kernel reads x[i - 1] only where i >= 1; the scheduler's common-subexpression pass
# computed that load before the `where`, for every i: a read before the buffer, and a
# segfault when the input was empty (its data pointer is not a buffer at all).
def pad_square(x0):
    v4 = F.hardsigmoid(x0 / (x0.abs() + 1)).reshape(-1)
    return F.pad(torch.square(v4), (1, 0)), v4


@pytest.mark.parametrize("target", TARGETS)
def test_guarded_loads_stay_guarded(target):
    check(pad_square, (torch.randn(5),), (torch.randn(0),), (torch.randn(3),), target=target)


# -- shapes that do not broadcast, in a branch the example does not take ---------------------
# masked_fill's capture rule raised ShapeError from inside tracing: an "internal error"
# instead of a located CompileError (and eager under fallback="eager").
def bad_branch(x0):
    v1 = x0.mT
    v2 = x0[0] * 1
    if v2.size(0) == 1:
        v4 = v1[v1.shape[0] // 2 :, ...]
    else:
        v4 = v1.masked_fill(v2 > 0, -1.0)
    return v4 + 1


@pytest.mark.parametrize("target", TARGETS)
def test_shape_errors_in_a_branch_are_located(target):
    f = cu.compile(bad_branch, target=target, fallback="error")
    with pytest.raises(cu.CompileError, match="do not broadcast") as info:
        f(torch.randn(4, 1))
    assert "internal error" not in str(info.value) and "test_fuzz_regressions.py" in str(info.value)
    g = cu.compile(bad_branch, target=target)
    x = torch.randn(4, 1)
    with pytest.warns(cu.CuvilFallbackWarning):
        torch.testing.assert_close(g(x), bad_branch(x))
