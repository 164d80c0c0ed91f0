"""CPU autocast is captured: regions entered in the function and calls made under it
compile with autocast's casts in the graph and give eager's results and dtypes; the call's
autocast state is part of the structure key; autocast a capture cannot reproduce is a
located CompileError (cuvil/autocast.py, [Note: autocast captured]). The casting rules
themselves, op by op: test_autocast_rules.py."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil import autocast, warm
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
@pytest.mark.parametrize("fn", [_inside, _set_enabled, _global_manager])
def test_autocast_in_function_compiles_with_its_casts(target: str, fn: object) -> None:
    f = cu.compile(fn, target=target, fallback="error")
    for n in (2, 5):
        got = f(*_inputs(n))
        assert got.dtype == BF16
        _same(got, fn(*_inputs(n)))
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0
    ops = [n.op for n in f.graphs[0].nodes]
    assert ops.count("cast") == 2 and "matmul" in ops  # both operands cast, as autocast casts them
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_the_capture_cannot_reproduce_is_a_located_error(monkeypatch) -> None:
    """Where a device's autocast is not captured (an XPU's or MPS's: tested here by taking
    CPU's off the list), entering it, or capturing an op under it, is a located error,
    and the failed capture leaves autocast as it was."""
    monkeypatch.setattr(autocast, "CAPTURED_DEVICES", frozenset())
    monkeypatch.setenv(warm.ENV, "0")  # a variant captured by another test would be reused
    f = cu.compile(_inside, target="reference", fallback="error")
    with pytest.raises(CompileError, match="autocast entered for cpu") as e:
        f(*_inputs(2))
    assert e.value.loc is not None and e.value.loc.line == _inside.__code__.co_firstlineno + 1
    assert e.value.hint and "only CPU and CUDA autocast regions are captured" in e.value.hint
    g = cu.compile(_global_manager, target="reference", fallback="error")
    with pytest.raises(CompileError, match="under autocast") as e:
        g(*_inputs(2))
    assert e.value.loc is not None and "x @ w" in (e.value.loc.excerpt() or "")
    h = cu.compile(_plain, target="reference", fallback="error")
    with torch.autocast("cpu", dtype=BF16):
        with pytest.raises(CompileError, match=r"called under autocast \(cpu bfloat16\)"):
            h(*_inputs(3))
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_disabled_region_compiles(target: str) -> None:
    f = cu.compile(_disabled, target=target, fallback="error")
    for n in (2, 5):
        _same(f(*_inputs(n)), _disabled(*_inputs(n)))
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0


@pytest.mark.parametrize("target", TARGETS)
def test_call_under_autocast_compiles_its_own_variant(target: str) -> None:
    f = cu.compile(_plain, target=target, fallback="error")
    _same(f(*_inputs(2)), _plain(*_inputs(2)))  # compiled outside autocast first
    with torch.autocast("cpu", dtype=BF16):
        got, want = f(*_inputs(3)), _plain(*_inputs(3))
    assert want.dtype == BF16
    _same(got, want)
    assert f.stats.compiles == 2
    assert "autocast changed (was off, now cpu bfloat16)" in f.stats.recompile_reasons[-1]
    _same(f(*_inputs(5)), _plain(*_inputs(5)))  # outside again: the first artifact, no compile
    assert f.stats.compiles == 2 and f.stats.cache_hits == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("enter", ["autocast", "amp", "set_enabled"])
def test_call_under_autocast_compiles_then_compiles_outside(target: str, enter: str) -> None:
    f = cu.compile(_plain, target=target, fallback="error")

    def amp_on() -> object:
        if enter == "autocast":
            return torch.autocast("cpu", dtype=BF16)
        if enter == "amp":
            return torch.amp.autocast("cpu", dtype=BF16)
        return _SetEnabled()

    for n in (2, 5):  # inside first: bf16 like torch, one compile for both sizes
        with amp_on():
            want = _plain(*_inputs(n))
            got = f(*_inputs(n))
        assert want.dtype == BF16
        _same(got, want)
    assert f.stats.compiles == 1 and f.stats.fallbacks == 0
    for n in (3, 6):  # outside after: fp32 (the autocast artifact is not reused)
        _same(f(*_inputs(n)), _plain(*_inputs(n)))
    assert f.stats.compiles == 2 and f.stats.fallbacks == 0


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


def test_submitted_call_under_autocast_runs_its_autocast_variant() -> None:
    # submit runs on the runtime's pool, where the caller's (thread-local) autocast is off:
    # the variant compiled for the call's autocast has its casts in the graph
    f = cu.compile(_plain, target="reference", fallback="error")
    with torch.autocast("cpu", dtype=BF16):
        want = _plain(*_inputs(2))
        got = f.submit(*_inputs(2)).result()
    _same(got, want)
    assert want.dtype == BF16 and f.stats.fallbacks == 0
