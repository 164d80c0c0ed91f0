"""Fixtures the cpu target's tests share."""

from __future__ import annotations

import pytest

from cuvil_backend_cpu import gemm_choice


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A kernel cache of the test's own (so the GEMM choice record starts empty) and no GEMM
    forced; what the process remembers of GEMM choices is forgotten before and after."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(gemm_choice.GEMM_ENV, raising=False)
    gemm_choice.forget()
    yield tmp_path / "cache"
    gemm_choice.forget()
