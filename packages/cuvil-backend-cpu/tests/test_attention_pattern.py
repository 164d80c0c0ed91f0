"""Hand-written attention, ``softmax(q @ kᵀ * s + mask) @ v``, rewritten to the ``cpu``
target's flash kernel (``cuvil_backend_cpu.attention_pattern``), each form checked against
eager PyTorch (values, NaNs and dtypes): every scale and mask spelling, queries that see
no key (NaN, as eager), broadcast masks, k given transposed, one key head, odd sizes,
symbolic sizes through one compile, and the chains that must stay as they are."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu import attention, attention_pattern
from cuvil_backend_cpu.attention import FlashAttention
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.testing import executable_of

NEG = float("-inf")


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, ...]]]:
    """The query shapes the flash kernel ran (not declined), so a test knows the kernel,
    not the composition it falls back to, made the result."""
    calls: list[tuple[int, ...]] = []
    run = FlashAttention.__call__

    def spy(self: FlashAttention, q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = run(self, q, *args, **kwargs)
        if out is not None:
            calls.append(tuple(q.shape))
        return out

    monkeypatch.setattr(FlashAttention, "__call__", spy)
    yield calls


def compiled(fn: Callable[..., Any]) -> Any:
    return cu.compile(fn, target="cpu", fallback="error", dynamic=True)


def lowered(f: Any) -> str:
    """The graph the target lowered (after its rewrites)."""
    graph = executable_of(f).program.graph
    assert graph is not None
    return graph.text


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5, equal_nan=True)


def heads(b: int, t: int, h: int, e: int, *, seed: int) -> torch.Tensor:
    """(b, h, t, e) as transformers makes it: a linear's (b, t, h*e) viewed and transposed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h * e, generator=g).view(b, t, h, e).transpose(1, 2)


def qkv(b: int, h: int, lq: int, s: int, e: int, ev: int | None = None) -> tuple[torch.Tensor, ...]:
    return heads(b, lq, h, e, seed=1), heads(b, s, h, e, seed=2), heads(b, s, h, ev or e, seed=3)


# -- the forms that become the kernel -------------------------------------------------------------


def bert(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def test_bert_form_two_sizes_one_compile(kernel_calls: list[tuple[int, ...]]) -> None:
    f = compiled(bert)
    for b, t in ((2, 40), (1, 23)):
        args = qkv(b, 3, t, t, 16)
        check(f(*args), bert(*args))
    assert len(f.graphs) == 1
    text = lowered(f)
    assert text.count("cpu_attention") == 1 and "softmax" not in text and "matmul" not in text
    assert 'scale = "div"' in text and "key_transposed = false" in text
    assert kernel_calls == [(2, 3, 40, 16), (1, 3, 23, 16)]


def gpt2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tril: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(k.shape[-1]))
    att = att.masked_fill(~tril[:t, :t], NEG)
    return torch.softmax(att, dim=-1) @ v


def test_causal_masked_fill_of_a_buffer_slice(kernel_calls: list[tuple[int, ...]]) -> None:
    tril = torch.tril(torch.ones(64, 64, dtype=torch.bool))
    f = compiled(gpt2)
    for t in (33, 17):
        args = (*qkv(2, 4, t, t, 24), tril)
        check(f(*args), gpt2(*args))
    text = lowered(f)
    # the bitwise_not is dropped: its operand is the kernel's keep mask
    assert "bitwise_not" not in text and 'mask_kind = "keep"' in text and 'scale = "mul"' in text
    assert len(kernel_calls) == 2


def test_queries_that_see_no_key_are_nan_as_in_eager(kernel_calls: list[tuple[int, ...]]) -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(hidden, NEG), -1) @ v

    q, k, v = qkv(1, 2, 20, 30, 8)
    hidden = torch.zeros(20, 30, dtype=torch.bool)
    hidden[3] = True  # query 3 sees nothing
    hidden[7, ::2] = True
    want = fn(q, k, v, hidden)
    assert want[:, :, 3].isnan().all() and not want[:, :, 7].isnan().any()
    f = compiled(fn)
    check(f(q, k, v, hidden), want)
    assert 'mask_kind = "drop"' in lowered(f) and kernel_calls


@pytest.mark.parametrize("order", ["scores_first", "mask_first"])
def test_additive_padding_mask_broadcast(order: str, kernel_calls: list[tuple[int, ...]]) -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        s = 0.25 * (q @ k.transpose(-1, -2))
        s = s + pad if order == "scores_first" else pad + s
        return torch.softmax(s, -1) @ v

    q, k, v = qkv(2, 3, 16, 19, 16)
    pad = torch.zeros(2, 1, 1, 19)
    pad[0, ..., 15:] = NEG
    pad[1, ..., :] = NEG  # every key of batch 1 hidden: NaN there, as eager
    f = compiled(fn)
    check(f(q, k, v, pad), fn(q, k, v, pad))
    assert 'mask_kind = "add"' in lowered(f) and kernel_calls


def transformers_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """transformers' ``eager_attention_forward`` (attn_implementation="eager"; its
    ``scaling`` is the module's ``head_dim**-0.5``, a Python float)."""
    w = torch.matmul(q, k.transpose(2, 3)) * 8**-0.5
    w = w + mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    w = torch.nn.functional.dropout(w, p=0.1, training=False)
    return torch.matmul(w, v).transpose(1, 2).contiguous()


def test_transformers_eager_attention(kernel_calls: list[tuple[int, ...]]) -> None:
    q, k, v = qkv(2, 4, 16, 16, 8)
    causal = torch.full((16, 16), NEG).triu(1)[None, None].expand(2, 1, 16, 16)
    f = compiled(transformers_eager)
    check(f(q, k, v, causal), transformers_eager(q, k, v, causal))
    assert "cpu_attention" in lowered(f) and kernel_calls


def test_key_given_transposed_and_odd_sizes(kernel_calls: list[tuple[int, ...]]) -> None:
    def fn(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ kt, dim=-1) @ v

    q, k, v = qkv(1, 2, 19, 23, 40, ev=24)
    for kt in (k.transpose(-1, -2), k.transpose(-1, -2).contiguous()):
        f = compiled(fn)
        check(f(q, kt, v), fn(q, kt, v))
        assert "key_transposed = true" in lowered(f)
    assert len(kernel_calls) == 2


def test_rank3_single_head_and_one_key_head(kernel_calls: list[tuple[int, ...]]) -> None:
    q3, k3, v3 = (t[:, 0] for t in qkv(2, 1, 12, 12, 8))
    f = compiled(bert)
    check(f(q3, k3, v3), bert(q3, k3, v3))
    # one key/value head read by every query head (matmul broadcasts it)
    q, _, _ = qkv(2, 4, 12, 12, 8)
    _, k, v = qkv(2, 1, 12, 12, 8)
    check(compiled(bert)(q, k, v), bert(q, k, v))
    assert len(kernel_calls) == 2


def test_short_queries_run_the_composition(kernel_calls: list[tuple[int, ...]]) -> None:
    q, k, v = qkv(1, 2, attention_pattern.MIN_QUERIES - 1, 40, 16)
    f = compiled(bert)
    check(f(q, k, v), bert(q, k, v))
    assert "cpu_attention" in lowered(f) and kernel_calls == []


def test_broadcast_batch_runs_the_composition(kernel_calls: list[tuple[int, ...]]) -> None:
    q, _, _ = qkv(3, 2, 16, 16, 8)
    _, k, v = qkv(1, 2, 16, 16, 8)
    f = compiled(bert)
    check(f(q, k, v), bert(q, k, v))
    assert kernel_calls == []  # the kernel declines batch dims that broadcast


# -- chains that must stay as they are -------------------------------------------------------------


def _scores_also_returned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    s = q @ k.transpose(-1, -2)
    return torch.softmax(s, -1) @ v, s


def _finite_fill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    # a finite fill is not -inf: a query that sees no key averages every value instead of NaN
    s = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), -1e9)
    return torch.softmax(s, -1) @ v


def _softmax_not_last(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v


def _probs_on_the_right(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return v.transpose(-1, -2) @ torch.softmax(q @ k.transpose(-1, -2), dim=-1)


def _scale_by_a_tensor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return torch.softmax(q @ k.transpose(-1, -2) / q.abs().amax(), -1) @ v


@pytest.mark.parametrize(
    "fn", [_scores_also_returned, _finite_fill, _softmax_not_last, _probs_on_the_right, _scale_by_a_tensor]
)
def test_not_rewritten(fn: Callable[..., Any]) -> None:
    args = qkv(1, 2, 16, 16, 16)
    f = compiled(fn)
    got, want = f(*args), fn(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        check(g, w)
    assert "cpu_attention" not in lowered(f)


def test_float64_not_rewritten() -> None:
    args = tuple(t.double() for t in qkv(1, 2, 16, 16, 8))
    f = compiled(bert)
    check(f(*args), bert(*args))
    assert "cpu_attention" not in lowered(f)


def test_rewrite_is_deterministic() -> None:
    f = compiled(gpt2)
    f(*qkv(1, 2, 16, 16, 8), torch.ones(32, 32, dtype=torch.bool).tril())
    graph = f.graphs[-1]
    assert attention_pattern.rewrite(graph).text == attention_pattern.rewrite(graph).text
    assert attention_pattern.rewrite(graph).text != graph.text


@pytest.mark.parametrize("lanes", [None, 16, 4], ids=["host", "lanes16", "lanes4"])
def test_kernel_empty_rows_zero_or_nan(lanes: int | None) -> None:
    # every tiling (the AVX-512 and NEON widths forced in plain vector arithmetic)
    flash = attention.kernel(KernelCache()) if lanes is None else FlashAttention(KernelCache(), lanes=lanes)
    q, k, v = qkv(1, 2, 16, 16, 8)
    keep = torch.ones(16, 16, dtype=torch.bool)
    keep[5] = False
    zeros = flash(q, k, v, keep)
    nans = flash(q, k, v, keep, empty_nan=True)
    assert zeros is not None and nans is not None
    assert (zeros[:, :, 5] == 0).all() and nans[:, :, 5].isnan().all()
    torch.testing.assert_close(zeros[:, :, :5], nans[:, :, :5], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("forced", ["sdpa", "eager", None], ids=["sdpa", "composition", "measured"])
def test_half_attention_forms(
    dtype: torch.dtype, forced: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a half type the chain is rewritten too and runs torch's attention in the type or
    the composition (``attention._half_pattern``), forced or measured: every mask spelling
    within half tolerance of eager, and queries that see no key NaN as in eager (such calls
    run the composition: torch's attention gives zeros there)."""
    from cuvil_backend_cpu import gemm_choice

    if forced is not None:
        monkeypatch.setenv(gemm_choice.GEMM_ENV, forced)
    ran: list[str] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*a: Any, **kw: Any) -> Any:
        ran.append("sdpa")
        return sdpa(*a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)

    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-5, atol=2**-5, equal_nan=True)

    def half(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(dtype) if t.is_floating_point() else t for t in ts)

    tril = torch.tril(torch.ones(64, 64, dtype=torch.bool))

    def padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return torch.softmax(0.25 * (q @ k.transpose(-1, -2)) + pad, -1) @ v

    def hidden_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(hidden, NEG), -1) @ v

    pad = torch.zeros(2, 1, 1, 19)
    pad[0, ..., 15:] = NEG
    hidden = torch.zeros(20, 19, dtype=torch.bool)
    hidden[3] = True  # query 3 sees nothing: NaN, as eager
    cases = [
        (bert, half(*qkv(2, 3, 40, 40, 16)), True),
        (gpt2, (*half(*qkv(2, 4, 33, 33, 24)), tril), True),
        (padded, half(*qkv(2, 3, 16, 19, 16), pad), True),
        (hidden_rows, (*half(*qkv(1, 2, 20, 19, 8)), hidden), False),
    ]
    for fn, args, sdpa_may_run in cases:
        f = compiled(fn)
        ran.clear()
        want = fn(*args)
        ran.clear()
        close(f(*args), want)
        if fn is bert:  # another sequence length, the same compile
            other = half(*qkv(1, 3, 23, 23, 16))
            close(f(*other), fn(*other))
            assert len(f.graphs) == 1
        assert "cpu_attention" in lowered(f) and "softmax" not in lowered(f)
        if not sdpa_may_run or forced == "eager":
            assert not ran, fn.__name__
        elif forced == "sdpa":
            assert ran, fn.__name__
    pad[1] = NEG  # a whole batch hidden: the composition, NaN as eager
    args = half(*qkv(2, 3, 16, 19, 16), pad)
    want = padded(*args)
    assert want[1].isnan().all()
    ran.clear()
    close(compiled(padded)(*args), want)
    assert not ran
