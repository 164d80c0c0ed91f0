"""The ``cpu`` target's attention kernel (``attention.c``) against eager
``F.scaled_dot_product_attention``: called directly on odd sizes, masks, grouped heads
and strided views, and through ``cu.compile`` with symbolic batch and sequence sizes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import cuvil as cu
from cuvil_backend_cpu import attention
from cuvil_backend_cpu.attention import FlashAttention
from cuvil_backend_cpu.kernel_cache import KernelCache


@pytest.fixture(scope="module", params=[None, 16, 4], ids=["host", "lanes16", "lanes4"])
def flash(request: pytest.FixtureRequest) -> FlashAttention:
    """The host's kernel, and the kernel with 16 and 4 lanes forced (the AVX-512 and NEON
    tilings, in plain vector arithmetic), so every host checks every tiling's logic."""
    if request.param is None:
        return attention.kernel(KernelCache())
    return FlashAttention(KernelCache(), lanes=request.param)


def _qkv(
    b: int, hq: int, hk: int, lq: int, s: int, e: int, ev: int, *, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, hq, lq, e, generator=g),
        torch.randn(b, hk, s, e, generator=g),
        torch.randn(b, hk, s, ev, generator=g),
    )


def _check(flash: FlashAttention, q: Any, k: Any, v: Any, mask: Any = None, **kw: Any) -> None:
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    got = flash(q, k, v, mask, **kw)
    assert got is not None, "the kernel declined a case it should run"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)


# L and S around and off the block sizes; E = 1, 63, 64, 80 (and Ev != E)
@pytest.mark.parametrize(
    "lq,s,e,ev",
    [(1, 1, 1, 1), (5, 7, 4, 6), (47, 129, 63, 63), (49, 130, 64, 80), (130, 200, 80, 64), (1, 300, 64, 64)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_sizes(flash: FlashAttention, lq: int, s: int, e: int, ev: int, causal: bool) -> None:
    _check(flash, *_qkv(2, 3, 3, lq, s, e, ev), is_causal=causal)


def test_causal_more_queries_than_keys(flash: FlashAttention) -> None:
    # top-left alignment: queries past the last key see every key
    _check(flash, *_qkv(1, 2, 2, 70, 20, 16, 16), is_causal=True)


@pytest.mark.parametrize("shape", [(2, 1, 1, 140), (60, 140), (2, 3, 60, 140), (1, 140), (3, 1, 140)])
def test_float_mask_broadcast(flash: FlashAttention, shape: tuple[int, ...]) -> None:
    q, k, v = _qkv(2, 3, 3, 60, 140, 32, 32)
    mask = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    mask[..., -7:] = float("-inf")
    _check(flash, q, k, v, mask)


@pytest.mark.parametrize("shape", [(2, 1, 1, 140), (60, 140), (2, 3, 60, 140), (60, 1)])
def test_bool_mask_broadcast(flash: FlashAttention, shape: tuple[int, ...]) -> None:
    q, k, v = _qkv(2, 3, 3, 60, 140, 32, 32)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(2)) > 0.3
    _check(flash, q, k, v, mask)


def test_fully_masked_rows_are_zero(flash: FlashAttention) -> None:
    q, k, v = _qkv(1, 2, 2, 9, 150, 8, 8)
    keep = torch.ones(9, 150, dtype=torch.bool)
    keep[3] = False
    _check(flash, q, k, v, keep)
    bias = torch.zeros(9, 150)
    bias[[0, 8]] = float("-inf")
    _check(flash, q, k, v, bias)


def test_nan_propagates(flash: FlashAttention) -> None:
    q, k, v = _qkv(1, 2, 2, 20, 30, 8, 8)
    q[0, 0, 3] = float("nan")  # a whole row of scores
    q[0, 1, 5, 2] = float("nan")
    k[0, 1, 7, 0] = float("nan")  # one score in every row of head 1
    want = F.scaled_dot_product_attention(q, k, v)
    got = flash(q, k, v)
    assert got is not None
    torch.testing.assert_close(got, want, equal_nan=True)


def test_grouped_query_heads(flash: FlashAttention) -> None:
    _check(flash, *_qkv(2, 6, 2, 33, 70, 16, 16), enable_gqa=True)
    _check(flash, *_qkv(1, 4, 1, 1, 70, 16, 16), enable_gqa=True, is_causal=True)


def test_scale(flash: FlashAttention) -> None:
    _check(flash, *_qkv(1, 2, 2, 10, 20, 16, 16), scale=0.37)


def test_strided_views(flash: FlashAttention) -> None:
    # as transformers makes them: (B, L, H, E) linear outputs transposed to (B, H, L, E)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 50, 3, 64, generator=g).transpose(1, 2)
    k = torch.randn(2, 70, 3, 64, generator=g).transpose(1, 2)
    v = torch.randn(2, 70, 3, 64, generator=g).transpose(1, 2)
    _check(flash, q, k, v, is_causal=True)
    # a view that is strided along e too, and a value slice of a wider tensor
    _check(flash, q.transpose(-1, -2).contiguous().transpose(-1, -2), k, torch.randn(2, 3, 70, 90)[..., 5:69])


@pytest.mark.parametrize("rank", [2, 3, 5])
def test_other_ranks(flash: FlashAttention, rank: int) -> None:
    lead = {2: (), 3: (3,), 5: (2, 2, 3)}[rank]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(*lead, n, 16, generator=g) for n in (9, 20, 20))
    _check(flash, q, k, v, is_causal=True)


def test_empty(flash: FlashAttention) -> None:
    _check(flash, *_qkv(2, 3, 3, 4, 0, 8, 8))  # no keys: zeros, as eager
    _check(flash, *_qkv(2, 3, 3, 0, 5, 8, 8))
    _check(flash, *_qkv(0, 3, 3, 4, 5, 8, 8))


def test_declines_what_it_does_not_run(flash: FlashAttention) -> None:
    q, k, v = _qkv(1, 2, 2, 4, 5, 8, 8)
    assert flash(q.double(), k.double(), v.double()) is None
    assert flash(q, k, v, torch.zeros(4, 5, dtype=torch.float64)) is None
    assert flash(q, k[:, :1].expand(1, 2, 5, 8), v) is not None  # broadcast heads are strides
    assert flash(q, k[:1].expand(3, 2, 5, 8), v) is None  # batch dims that broadcast: eager's


# -- bfloat16 ----------------------------------------------------------------------------


def _bf16_here(flash: FlashAttention) -> None:
    """An emulated kernel (another ISA under qemu: it takes tensors) declines bfloat16, whose
    callers then run torch's or the widened path: checked, then the test is skipped."""
    if flash._tensors:
        q, k, v = (t.to(torch.bfloat16) for t in _qkv(1, 2, 2, 4, 5, 8, 8))
        assert flash(q, k, v) is None
        pytest.skip("an emulated kernel runs float32 only")


def _check_bf16(flash: FlashAttention, q: Any, k: Any, v: Any, mask: Any = None, **kw: Any) -> None:
    """The kernel on bfloat16 tensors against float64 attention of the same (rounded) values:
    within the one rounding of the result (and float32 arithmetic before it)."""
    _bf16_here(flash)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    if mask is not None and mask.is_floating_point():
        mask = mask.to(torch.bfloat16)
    wide = None if mask is None or not mask.is_floating_point() else mask.double()
    want = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask if wide is None else wide, **kw
    )
    got = flash(q, k, v, mask, **kw)
    assert got is not None, "the kernel declined a case it should run"
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=2**-7)


@pytest.mark.parametrize("lq,s,e,ev", [(1, 1, 1, 1), (5, 7, 4, 6), (47, 129, 63, 63), (49, 130, 64, 80)])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_sizes(flash: FlashAttention, lq: int, s: int, e: int, ev: int, causal: bool) -> None:
    _check_bf16(flash, *_qkv(2, 3, 3, lq, s, e, ev), is_causal=causal)


def test_bf16_masks_heads_and_views(flash: FlashAttention) -> None:
    q, k, v = _qkv(2, 4, 2, 20, 33, 16, 16)
    _check_bf16(flash, q, k, v, torch.randn(20, 33), enable_gqa=True)  # (a bfloat16 float mask)
    _check_bf16(flash, q, k, v, torch.rand(2, 1, 1, 33) > 0.3, enable_gqa=True)
    x = torch.randn(2, 20, 3 * 64).to(torch.bfloat16)  # heads as views of one projection
    qs, ks, vs = (x[..., i * 64 : (i + 1) * 64].view(2, 20, 4, 16).transpose(1, 2) for i in range(3))
    _check_bf16(flash, qs, ks, vs, scale=0.3)
    hidden = torch.ones(20, 33, dtype=torch.bool)
    hidden[4] = False  # query 4 sees no key: zeros, or NaN with empty_nan
    out = flash(*(t.to(torch.bfloat16) for t in (q, k, v)), hidden, enable_gqa=True)
    nan = flash(*(t.to(torch.bfloat16) for t in (q, k, v)), hidden, enable_gqa=True, empty_nan=True)
    assert out is not None and nan is not None
    assert (out[:, :, 4] == 0).all() and nan[:, :, 4].isnan().all() and not out.isnan().any()


def test_bf16_rounds_once_as_torch_does(flash: FlashAttention) -> None:
    """One key: the output is v itself, exactly, whatever the scores (the result rounded once
    from float32 values that are bfloat16 values already)."""
    _bf16_here(flash)
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(1, 2, 2, 9, 1, 8, 24))
    got = flash(q, k, v)
    assert got is not None and torch.equal(got, v.expand(1, 2, 9, 24))


# -- through cu.compile -----------------------------------------------------------------


class _SdpaCalls(TorchFunctionMode):
    """Counts calls of torch's own attention (made by eager code or an extern falling back)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is F.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _heads(x: torch.Tensor, w: torch.Tensor, h: int) -> torch.Tensor:
    b, n, _ = x.shape
    return (x @ w).view(b, n, h, -1).transpose(1, 2)


def attend(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> torch.Tensor:
    q, k, v = _heads(x, wq, 4), _heads(x, wk, 2), _heads(x, wv, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return a.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)


def attend_padded(x: torch.Tensor, keep: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    q = _heads(x, wq, 2)
    bias = torch.zeros(keep.shape, dtype=x.dtype).masked_fill(~keep, float("-inf"))[:, None, None, :]
    return F.scaled_dot_product_attention(q, q, q, attn_mask=bias) + F.scaled_dot_product_attention(
        q, q, q, attn_mask=keep[:, None, None, :]
    )


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_compiled_symbolic_batch_and_sequence(target: str) -> None:
    g = torch.Generator().manual_seed(5)
    wq, wk, wv = (
        torch.randn(32, 32, generator=g),
        torch.randn(32, 16, generator=g),
        torch.randn(32, 16, generator=g),
    )
    f = cu.compile(attend, target=target, fallback="error")
    # big enough for the cpu target to prefer its kernel (attention.MIN_SCORES), still fast
    for b, n in [(2, 130), (3, 150)]:
        x = torch.randn(b, n, 32, generator=g)
        counter = _SdpaCalls()
        with counter:
            got = f(x, wq, wk, wv)
        want = attend(x, wq, wk, wv)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if target == "cpu":
            assert counter.calls == 0, "the cpu target ran torch's attention, not its own"
    assert f.stats.compiles == 1, f.stats.recompile_reasons


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_compiled_padding_masks(target: str) -> None:
    g = torch.Generator().manual_seed(6)
    wq = torch.randn(16, 16, generator=g)
    f = cu.compile(attend_padded, target=target, fallback="error")
    for b, n in [(2, 260), (3, 270)]:
        x = torch.randn(b, n, 16, generator=g)
        keep = torch.rand(b, n, generator=g) > 0.3
        keep[:, 0] = True
        counter = _SdpaCalls()
        with counter:
            got = f(x, keep, wq)
        torch.testing.assert_close(got, attend_padded(x, keep, wq), rtol=1e-4, atol=1e-4)
        if target == "cpu":
            assert counter.calls == 0, "the cpu target ran torch's attention, not its own"
    assert f.stats.compiles == 1, f.stats.recompile_reasons


def decode_step(x: torch.Tensor, past: torch.Tensor, wq: torch.Tensor, wkv: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(_heads(x, wq, 4), _heads(past, wkv, 4), _heads(past, wkv, 4))


def test_compiled_decode_step_runs_the_decode_kernel() -> None:
    """One query against many keys: not the flash kernel's tiles of queries but the decode
    kernel (cuvil_backend_cpu.decode_attention), never torch's, with the same results."""
    g = torch.Generator().manual_seed(7)
    wq, wkv = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g)
    f = cu.compile(decode_step, target="cpu", fallback="error")
    x, past = torch.randn(1, 1, 32, generator=g), torch.randn(1, 300, 32, generator=g)
    f(x, past, wq, wkv)  # compiles
    counter = _SdpaCalls()
    with counter:
        got = f(x, past, wq, wkv)
    torch.testing.assert_close(got, decode_step(x, past, wq, wkv), rtol=1e-4, atol=1e-4)
    assert counter.calls == 0
