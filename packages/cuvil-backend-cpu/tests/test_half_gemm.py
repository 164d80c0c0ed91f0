"""Float16/bfloat16 linears and matrix products on cpu ([Note: half-precision GEMMs] in
cuvil_backend_cpu/half_gemm.py): every candidate (torch's GEMM in the half type, oneDNN's
on a packed half weight where this CPU takes it, a float32 GEMM on widened operands)
matches eager, follows in-place weight updates, and the measured choice is remembered
under keys that name the dtype."""

from __future__ import annotations

import json

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu import externs, gemm_choice, half_gemm
from cuvil_backend_cpu.testing import executable_of

HALVES = (torch.bfloat16, torch.float16)


def _mlp(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(48, 80), torch.nn.GELU(), torch.nn.Linear(80, 24, bias=False))
    return m.eval().to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    # summation order differs between GEMMs: a few ulps of the half type
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("forced", ["eager", "f32", "onednn"])
def test_each_candidate_matches_eager_and_follows_weight_updates(
    private_cache, monkeypatch, forced, dtype
) -> None:
    if forced == "onednn" and not (externs._ONEDNN and half_gemm._onednn_takes(dtype)):
        pytest.skip(f"this CPU's oneDNN has no {dtype} linear")
    monkeypatch.setenv(gemm_choice.GEMM_ENV, forced)
    m = _mlp(dtype)
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for rows in (1, 7, 33):
            x = torch.randn(rows, 48).to(dtype)
            _close(f(x), m(x))
        m[0].weight.mul_(0.5)  # a prepared (packed or widened) weight is rebuilt for the new version
        x = torch.randn(5, 48).to(dtype)
        _close(f(x), m(x))
    assert f.stats.compiles == 1
    assert not any(private_cache.rglob("gemm-*.json"))  # forced: nothing measured


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_measured_choice_is_keyed_by_dtype(private_cache, dtype) -> None:
    m = _mlp(dtype)
    f = cu.compile(m, target="cpu", fallback="error")

    def attention(q, k, v):  # (relu, not softmax: hand-written attention becomes one node)
        return torch.relu(q @ k.transpose(-1, -2)) @ v

    a = cu.compile(attention, target="cpu", fallback="error")
    q, k, v = (torch.randn(2, 3, 10, 16).to(dtype) for _ in range(3))
    x = torch.randn(20, 48).to(dtype)
    with torch.no_grad():
        _close(f(x), m(x))
        _close(a(q, k, v), attention(q, k, v))
    (record,) = private_cache.rglob("gemm-*.json")
    choices = json.loads(record.read_text())
    name = str(dtype).removeprefix("torch.")
    threads = torch.get_num_threads()
    assert f"32x48x80+b@{threads}:{name}" in choices and f"32x80x24@{threads}:{name}" in choices
    assert f"b8:64x16x10@{threads}:{name}" in choices  # the batched products, 6 x 10 rows
    assert set(choices.values()) <= {"eager", "f32", "onednn"}
    assert set(externs_of(a)) == {"matmul"}


def externs_of(compiled) -> list[str]:
    from cuvil_ir.tensor_ir.program import Extern

    return [s.node.op for s in executable_of(compiled).program.steps if isinstance(s, Extern)]


def test_a_float32_copy_of_a_weight_goes_when_the_half_gemm_wins(private_cache, monkeypatch) -> None:
    """The widened weight the ``f32`` candidate needs is dropped when another candidate
    won the measurement (memory: a float32 copy is twice the half weight)."""
    monkeypatch.setattr(gemm_choice, "_measure", lambda run: "eager")
    w = torch.randn(24, 48).to(torch.bfloat16)
    x = torch.randn(3, 48).to(torch.bfloat16)
    _close(half_gemm.linear(x, w, None, onednn=externs._ONEDNN), torch.nn.functional.linear(x, w))
    assert not [k for k in half_gemm._PREPARED if k[0] == id(w)]


def test_a_shape_is_measured_once_on_either_call_path(private_cache, monkeypatch) -> None:
    """The functional linear (with oneDNN's candidates) and the ``out=`` one (without them)
    keep their answers apart: calling both for one shape, over and over, measures each once
    (they once shared a key, and each call re-measured what the other had answered)."""
    measured: list[tuple[str, ...]] = []
    real = gemm_choice._measure

    def counting(run):
        measured.append(tuple(sorted(run)))
        return real(run)

    monkeypatch.setattr(gemm_choice, "_measure", counting)
    w = torch.randn(24, 48).to(torch.bfloat16)
    b = torch.randn(24).to(torch.bfloat16)
    x = torch.randn(3, 48).to(torch.bfloat16)
    want = torch.nn.functional.linear(x, w, b)
    for _ in range(4):
        _close(half_gemm.linear(x, w, b, onednn=externs._ONEDNN), want)
        out = torch.empty_like(want)
        externs.linear_into(out, x, w, b, has_bias=True)
        _close(out, want)
    assert len(measured) == (2 if externs._ONEDNN else 1), measured


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("forced", ["eager", "f32"])
def test_half_sdpa_matches_eager(private_cache, monkeypatch, forced, dtype) -> None:
    """sdpa in a half type: torch's in the type, or widened through the float32 path (the
    flash kernel at these sizes), rounded once; with a causal mask, a bool mask and a
    half additive mask."""
    monkeypatch.setenv(gemm_choice.GEMM_ENV, forced)
    F = torch.nn.functional

    def attend(q, k, v, keep, bias):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return a, b, F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 32, generator=g).to(dtype) for _ in range(3))
    keep = torch.rand(128, 128, generator=g) > 0.2
    bias = (torch.randn(128, 128, generator=g) * 2).to(dtype)
    f = cu.compile(attend, target="cpu", fallback="error")
    for got, want in zip(f(q, k, v, keep, bias), attend(q, k, v, keep, bias)):
        _close(got, want)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_convolutions_run_on_a_packed_weight(dtype) -> None:
    """A half convolution runs oneDNN's on its weight packed once per version where this
    CPU's oneDNN convolves the type (eager reorders the weight every call), else eager's;
    either matches eager, and an in-place weight update repacks."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 4, 1),
    )
    m = m.eval().to(dtype)
    f = cu.compile(m, target="cpu", fallback="error")
    packed_before = set(externs._FOLDED)
    with torch.no_grad():
        for step in range(3):
            if step == 2:
                m[0].weight.mul_(-1.0)
            x = torch.randn(2, 8, 10, 10).to(dtype)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-5, atol=2**-5)
    packed = {k for k in externs._FOLDED if k not in packed_before}
    if externs._ONEDNN and externs._onednn_conv_takes(dtype):
        assert {id(m[0].weight), id(m[3].weight)} <= packed
    else:
        assert not packed
