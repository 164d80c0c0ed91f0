"""Float16 and bfloat16 kernels on the ``ascend`` target, in simulation: the same kernels
as ``cuda``'s ([Note: half precision in Triton]: half in memory, float32 in the unified
buffer, rounded where eager rounds) under Ascend's rules in bytes: a tile row of a half
buffer is 32-byte aligned at 16 elements (8 for float32), and a kernel's unified-buffer
need counts its float32 value tiles and the 2-byte tile each half load lands in."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.testing import half_coverage
from cuvil.testing.conformance import TOLERANCES
from cuvil_backend_ascend.launch import AscendLauncher
from cuvil_backend_ascend.policy import FUSION, POLICY
from cuvil_backend_ascend.rules import (
    LaunchRuleError,
    align_elements,
    check_launch,
    element_cost,
    needed_bytes,
)

pytestmark = pytest.mark.usefixtures("simulation")

HALVES = (torch.bfloat16, torch.float16)


def _launchers(cf: Any) -> list[AscendLauncher]:
    art = cf.artifacts[-1]
    assert art.target == "ascend", art.reason
    out = []
    for launch in art.executable._runner.kernels.values():
        launch.fn.launches = []
        out.append(launch.fn)
    return out


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_every_bit_pattern_through_a_kernel(dtype: torch.dtype) -> None:
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    f = cu.compile(lambda t: t * 1.0 + 0.0, target="ascend", fallback="error")
    _same_bits(f(x), x * 1.0 + 0.0)


def _rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.softmax(x, -1), F.layer_norm(x, (x.shape[-1],), w, b), (x * 2 + b).sigmoid(), x.sum(-1)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("n", [7, 5000])
def test_half_kernels_keep_the_rules_in_bytes(dtype: torch.dtype, n: int) -> None:
    """One tile and looped rows, and a pointwise chain: eager's values within the half
    tolerance, every launch's rows a multiple of 32 bytes in the half buffers (16
    elements), every launch inside the unified-buffer share."""
    g = torch.Generator().manual_seed(n)
    args = tuple(
        t.to(dtype)
        for t in (
            torch.randn(6, n, generator=g) * 3,
            torch.randn(n, generator=g),
            torch.randn(n, generator=g),
        )
    )
    cf = cu.compile(_rows, target="ascend", fallback="error")
    cf(*args)
    seen = _launchers(cf)
    for got, want in zip(cf(*args), _rows(*args)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])
    assert all(launcher.tk.narrow_bytes == 2 for launcher in seen)
    for launcher in seen:
        assert align_elements(launcher.tk, POLICY) == 16
        for _, config in launcher.launches:
            assert config.get("RBLOCK", config["XBLOCK"]) % 16 == 0
            assert needed_bytes(launcher.tk, config, POLICY) <= POLICY.budget
    if n == 5000:
        assert any(not c.get("ONE_TILE", True) for lch in seen for _, c in lch.launches)


def test_a_half_row_of_16_bytes_is_refused() -> None:
    """Eight elements are 32 bytes of float32 but 16 of a half buffer: refused, naming both."""
    cf = cu.compile(lambda t: t + 1, target="ascend", fallback="error")
    cf(torch.randn(64).to(torch.bfloat16))
    (launcher,) = _launchers(cf)
    with pytest.raises(LaunchRuleError, match=r"16 bytes \(8 elements of 2 bytes\)"):
        check_launch(launcher.tk, {"XBLOCK": 8}, (1,), POLICY)
    check_launch(launcher.tk, {"XBLOCK": 16}, (1,), POLICY)


def test_a_half_load_lands_in_a_tile_of_its_own() -> None:
    """The unified-buffer cost of an element of a half kernel: its float32 value tiles, its
    address and the 2-byte landing tile of a load; a float32 kernel has no landing tile."""
    half = cu.compile(lambda t: t * 3 - 1, target="ascend", fallback="error")
    half(torch.randn(64).to(torch.float16))
    wide = cu.compile(lambda t: t * 3 - 1, target="ascend", fallback="error")
    wide(torch.randn(64))
    (h,), (w,) = _launchers(half), _launchers(wide)
    assert h.tk.element_bytes == w.tk.element_bytes == 4
    assert (h.tk.narrow_bytes, w.tk.narrow_bytes) == (2, 4)
    address = POLICY.address_bytes
    assert element_cost(h.tk, 0, POLICY) == h.tk.tiles[0] * 4 + address + 2
    assert element_cost(w.tk, 0, POLICY) == w.tk.tiles[0] * 4 + address


@pytest.mark.slow  # the corpus captured twice per type (the cpu target's twin runs in nox -s tests)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_programs_call_torch_only_where_float32_does(dtype: torch.dtype) -> None:
    half_coverage.check(FUSION, dtype)
