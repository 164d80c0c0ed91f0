"""Autocast is never a silent fp32 result: a located CompileError under fallback="error",
eager (bf16, like torch) under fallback="eager", and the call's autocast state is part of
the structure key (cuvil/autocast.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import cuvil as cu
from cuvil.errors import CompileError

TARGETS = [t for t in ("reference", "cpu") if t in {b.name for b in cu.backends() if b.available}]
BF16 = torch.bfloat16


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 4, generator=g), torch.randn(4, 3, generator=g)


def _inside(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=BF16):
        return x @ w


def _plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu()


_AMP = torch.amp.autocast("cpu", dtype=BF16)  # entered by a `with` on a name: no call to see


def _global_manager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with _AMP:
        return x @ w


def _set_enabled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    torch.set_autocast_enabled("cpu", True)
    try:
        return x @ w
    finally:
        torch.set_autocast_enabled("cpu", False)


def _disabled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", enabled=False):  # as models do around rotary embeddings
        return x @ w


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [_inside, _set_enabled])
def test_autocast_in_function_is_a_located_error(target: str, fn: object) -> None:
    f = cu.compile(fn, target=target, fallback="error")
    with pytest.raises(CompileError, match="autocast entered for cpu") as e:
        f(*_inputs(2))
    assert e.value.loc is not None and e.value.loc.line == fn.__code__.co_firstlineno + 1  # the call
    assert e.value.hint and "not supported yet" in e.value.hint
    assert not torch.is_autocast_enabled("cpu")  # the failed capture left autocast as it was


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_entered_without_a_visible_call_is_a_located_error(target: str) -> None:
    f = cu.compile(_global_manager, target=target, fallback="error")
    with pytest.raises(CompileError, match="under autocast") as e:
        f(*_inputs(2))
    assert e.value.loc is not None and "x @ w" in (e.value.loc.excerpt() or "")
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_in_function_runs_eagerly_by_default(target: str) -> None:
    f = cu.compile(_inside, target=target)
    for n in (2, 5):
        with pytest.warns(cu.CuvilFallbackWarning, match="autocast") if n == 2 else warnings.catch_warnings():
            got = f(*_inputs(n))
        _same(got, _inside(*_inputs(n)))
        assert got.dtype == BF16


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_disabled_region_compiles(target: str) -> None:
    f = cu.compile(_disabled, target=target, fallback="error")
    for n in (2, 5):
        _same(f(*_inputs(n)), _disabled(*_inputs(n)))
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0


@pytest.mark.parametrize("target", TARGETS)
def test_call_under_autocast_is_an_error_and_never_reuses_an_fp32_artifact(target: str) -> None:
    f = cu.compile(_plain, target=target, fallback="error")
    _same(f(*_inputs(2)), _plain(*_inputs(2)))  # compiled outside autocast first
    with torch.autocast("cpu", dtype=BF16):
        with pytest.raises(CompileError, match=r"called under autocast \(cpu bfloat16\)"):
            f(*_inputs(3))
    assert f.stats.compiles == 2
    assert "autocast changed (was off, now cpu bfloat16)" in f.stats.recompile_reasons[-1]
    _same(f(*_inputs(5)), _plain(*_inputs(5)))  # outside again: the first artifact, no compile
    assert f.stats.compiles == 2 and f.stats.cache_hits == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("enter", ["autocast", "amp", "set_enabled"])
def test_call_under_autocast_runs_eagerly_then_compiles_outside(target: str, enter: str) -> None:
    f = cu.compile(_plain, target=target)

    def amp_on() -> object:
        if enter == "autocast":
            return torch.autocast("cpu", dtype=BF16)
        if enter == "amp":
            return torch.amp.autocast("cpu", dtype=BF16)
        return _SetEnabled()

    for n in (2, 5):  # inside first: eager, bf16 like torch
        with amp_on():
            want = _plain(*_inputs(n))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cu.CuvilFallbackWarning)
                got = f(*_inputs(n))
        assert want.dtype == BF16
        _same(got, want)
    assert f.stats.compiles == 1 and f.stats.fallbacks == 2
    for n in (3, 6):  # outside after: compiled, fp32 (the eager artifact is not reused)
        _same(f(*_inputs(n)), _plain(*_inputs(n)))
    assert f.stats.compiles == 2 and f.stats.fallbacks == 2


class _SetEnabled:
    def __enter__(self) -> None:
        torch.set_autocast_enabled("cpu", True)

    def __exit__(self, *exc: object) -> None:
        torch.set_autocast_enabled("cpu", False)


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_of_another_device_does_not_matter_on_cpu(target: str) -> None:
    # CUDA autocast does not change CPU ops: same artifact, no error (set directly: the
    # context manager disables itself on a machine without CUDA)
    f = cu.compile(_plain, target=target, fallback="error")
    _same(f(*_inputs(2)), _plain(*_inputs(2)))
    torch.set_autocast_enabled("cuda", True)
    try:
        _same(f(*_inputs(3)), _plain(*_inputs(3)))
        g = cu.compile(_plain, target=target, fallback="error")  # captured with it on
        _same(g(*_inputs(4)), _plain(*_inputs(4)))
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert f.stats.compiles == 1 and g.stats.compiles == 1


def test_submitted_call_under_autocast_runs_eagerly_under_it() -> None:
    # submit runs on the runtime's pool, where the caller's (thread-local) autocast is off
    f = cu.compile(_plain, target="reference")
    with torch.autocast("cpu", dtype=BF16):
        want = _plain(*_inputs(2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cu.CuvilFallbackWarning)
            got = f.submit(*_inputs(2)).result()
    _same(got, want)
    assert want.dtype == BF16 and f.stats.fallbacks == 1
