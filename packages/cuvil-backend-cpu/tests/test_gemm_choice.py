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


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(gemm_choice.GEMM_ENV, raising=False)
    gemm_choice.forget()
    yield tmp_path / "cache"
    gemm_choice.forget()


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
