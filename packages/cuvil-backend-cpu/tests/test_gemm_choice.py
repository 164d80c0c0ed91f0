"""The per-shape GEMM choice for float32 linears ([Note: GEMM choice] in
cuvil_backend_cpu/gemm_choice.py): both GEMMs match eager, the first call of a shape
measures and remembers (in memory and in a private JSON record), a forced choice is
obeyed, and a damaged or foreign record is ignored, never trusted or fatal."""

from __future__ import annotations

import json
import os

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu import externs, gemm_choice

pytestmark = pytest.mark.skipif(not externs._ONEDNN, reason="torch built without oneDNN")


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(48, 80), torch.nn.Tanh(), torch.nn.Linear(80, 24, bias=False)
    ).eval()


@pytest.mark.parametrize("forced", ["onednn", "mkl"])
def test_each_gemm_matches_eager_and_follows_weight_updates(private_cache, monkeypatch, forced) -> None:
    monkeypatch.setenv(gemm_choice.GEMM_ENV, forced)
    m = _mlp()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for rows in (7, 33):  # two row buckets, one compile
            x = torch.randn(rows, 48)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        m[0].weight.mul_(0.5)  # a packed oneDNN weight is rebuilt for the new version
        x = torch.randn(5, 48)
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    assert f.stats.compiles == 1
    assert not any(private_cache.rglob("gemm-*.json"))  # forced: nothing measured


def test_our_gemv_runs_decode_rows_when_forced_and_matches_eager(private_cache, monkeypatch) -> None:
    """``CUVIL_CPU_GEMM=gemv``: float32 linears of few rows run quant_linear.c's GEMV (a
    spy says it ran), with and without bias, matching eager; more rows than the GEMV
    takes run a GEMM as before."""
    from cuvil_backend_cpu import quant_linear

    monkeypatch.setenv(gemm_choice.GEMM_ENV, "gemv")
    ran: list[tuple[int, ...]] = []
    real = quant_linear.QuantLinearKernel.gemv

    def spy(self, out, x, *args, **kwargs):
        ran.append((tuple(x.shape), kwargs["fmt"]))
        return real(self, out, x, *args, **kwargs)

    monkeypatch.setattr(quant_linear.QuantLinearKernel, "gemv", spy)
    m = _mlp()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for rows in (1, 3, quant_linear.F32_GEMV_ROWS, 40):
            x = torch.randn(rows, 48)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert sorted({r for r, _ in ran}) == [(1, 48), (1, 80), (3, 48), (3, 80), (16, 48), (16, 80)]
    assert {fmt for _, fmt in ran} == {"f32"}
    assert f.stats.compiles == 1


@pytest.mark.parametrize("n,k", [(1, 1), (5, 3), (31, 33), (64, 100), (257, 129)])
def test_f32_gemv_against_float64(n: int, k: int) -> None:
    """The GEMV on float32 weights, odd sizes (tails of the vector width and of its blocks
    of rows), strided activations, bias: against a float64 product."""
    from cuvil_backend_cpu import quant_linear
    from cuvil_backend_cpu.kernel_cache import KernelCache

    gemv = quant_linear.f32_gemv(KernelCache())
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for x in (
        torch.randn(3, k, generator=g),
        torch.randn(2, 2 * k, generator=g)[:, ::2],
        torch.randn(1, 1, k),
    ):
        for bias in (None, b):
            got = gemv(x, w, bias)
            assert got is not None and got.shape == (*x.shape[:-1], n)
            want = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
            scale = (x.double().abs() @ w.double().abs().t()).max().item() + 1
            torch.testing.assert_close(got.double(), want, rtol=0, atol=4e-6 * scale)
    assert gemv(torch.randn(quant_linear.F32_GEMV_ROWS + 1, k), w, None) is None  # a GEMM's rows
    assert gemv(torch.randn(2, k).double(), w.double(), None) is None


def test_first_call_of_a_shape_measures_and_remembers(private_cache, monkeypatch) -> None:
    m = _mlp()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        x = torch.randn(20, 48)
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    (record,) = private_cache.rglob("gemm-*.json")
    choices = json.loads(record.read_text())
    threads = torch.get_num_threads()
    # rows 20 -> bucket 32; both linears of the MLP, with and without bias
    assert set(choices) == {f"32x48x80+b@{threads}", f"32x80x24@{threads}"}
    assert set(choices.values()) <= set(gemm_choice.CANDIDATES)
    assert oct(record.stat().st_mode & 0o777) in ("0o600", "0o644")

    # a later call (and a fresh process, here: forgotten memory) reads the record back
    gemm_choice.forget()

    def measured_again(run):
        raise AssertionError("a remembered shape was measured again")

    monkeypatch.setattr(gemm_choice, "_measure", measured_again)
    with torch.no_grad():
        x = torch.randn(17, 48)  # rows 17: bucket 32 too
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("damage", ["not json", "foreign"])
def test_a_damaged_or_foreign_record_is_ignored(private_cache, damage) -> None:
    path = gemm_choice._record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage == "not json":
        path.write_text("{ this is not json")
    else:
        path.write_text(json.dumps({f"32x48x80+b@{torch.get_num_threads()}": "mkl"}))
        os.chmod(path, 0o666)  # writable by others: never read
    m = _mlp()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        x = torch.randn(20, 48)
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    assert gemm_choice._choices is not None
    assert len(gemm_choice._choices) == 2  # measured anew, both shapes


@pytest.mark.parametrize("winner", ["onednn", "mkl", "packed"])
def test_the_losers_packed_copies_are_dropped(private_cache, monkeypatch, winner) -> None:
    """Once a shape's GEMM is chosen, the copies of the weight that the other candidates
    packed are not kept (a float32 model kept oneDNN's and our packing of every weight);
    the winner's is, and a second shape that picks another GEMM repacks, with eager's
    results throughout."""
    from cuvil_backend_cpu import packed_gemm
    from cuvil_backend_cpu.kernel_cache import KernelCache

    cache = KernelCache()
    ours = packed_gemm.f32_linear(cache)
    run = externs.linear_with_ours(None, ours)  # type: ignore[arg-type]
    w = torch.randn(96, 64)
    b = torch.randn(96)

    def holds() -> set[str]:
        held = set()
        hit = externs._LINEAR_PACKED.get(id(w))
        if hit is not None and hit[0]() is w:
            held.add("onednn")
        if any((id(w), kn) in packed_gemm.kernel(cache)._packed for kn in (False, True)):
            held.add("packed")
        return held

    monkeypatch.setenv(gemm_choice.GEMM_ENV, winner)
    x = torch.randn(40, 64)
    torch.testing.assert_close(run(x, w, b, has_bias=True), torch.nn.functional.linear(x, w, b))
    assert holds() == ({winner} & {"onednn", "packed"})
    # the same weight at another row count, where another GEMM wins: the first winner's copy
    # goes, the new one's is made
    other = {"onednn": "packed", "mkl": "onednn", "packed": "mkl"}[winner]
    monkeypatch.setenv(gemm_choice.GEMM_ENV, other)
    x = torch.randn(300, 64)
    torch.testing.assert_close(run(x, w, b, has_bias=True), torch.nn.functional.linear(x, w, b))
    assert holds() == ({other} & {"onednn", "packed"})
