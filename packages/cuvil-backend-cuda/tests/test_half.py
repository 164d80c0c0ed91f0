"""Float16 and bfloat16 kernels on the ``cuda`` target ([Note: half precision in Triton] in
cuvil_ir/triton_source/functions.py): loads and stores in the half type, float32 in
registers, rounded where eager rounds, reductions accumulated in float32. Run in Triton's
interpreter against eager (eager's bits where the math is exact, the half tolerance of
:data:`cuvil.testing.conformance.TOLERANCES` elsewhere), and compiled to PTX for sm_90,
which must load and store 2-byte elements and convert with the half-precision ``cvt``
instructions. Every corpus program in each half type calls torch only where its float32
twin does (:mod:`cuvil.testing.half_coverage`)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.testing import half_coverage
from cuvil.testing.conformance import TOLERANCES
from cuvil_backend_cuda.policy import FUSION

pytestmark = pytest.mark.usefixtures("interpreter")

HALVES = (torch.bfloat16, torch.float16)
#: the PTX conversion float32 -> the type (round to nearest even; one value or a pair) on sm_90
ROUNDING = {torch.bfloat16: r"cvt\.rn\.bf16(x2)?\.f32", torch.float16: r"cvt\.rn\.f16(x2)?\.f32"}


def _kernels(cf: Any) -> dict[str, dict[str, str]]:
    art = cf.artifacts[-1]
    assert art.target == "cuda", art.reason
    return art.executable.kernel_texts


def _report(cf: Any) -> Any:
    return cf.artifacts[-1].executable.report


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values bit for bit (so -0.0 is not 0.0); NaN where eager has NaN (any payload)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    bits = torch.int16 if want.element_size() == 2 else torch.int32
    g, w = got[~nan].view(bits), want[~nan].view(bits)
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (
        f"{bad.numel()} elements differ, first {got[~nan][bad[0]]} vs {want[~nan][bad[0]]}"
    )


def _every_pattern(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def _edge_floats() -> torch.Tensor:
    """Float32 values around every rounding question: ties (even and odd), overflow of
    float16, subnormals of both types, infinities, NaN, signed zero, random bits."""
    g = torch.Generator().manual_seed(0)
    rand_bits = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    ties = torch.tensor(
        [0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000], dtype=torch.int32
    )  # bf16 / f16 ties
    edges = torch.tensor(
        [0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e5, -1e5, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e-40, -1e-42]
        + [float("inf"), float("-inf"), float("nan"), 3.0e38, -3.39e38, 1.0 / 3.0]
    )
    return torch.cat([rand_bits.view(torch.float32), ties.view(torch.float32), edges])


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_every_bit_pattern_loads_and_stores_exactly(dtype: torch.dtype) -> None:
    """All 65536 patterns: widened to float32 (exact), and through a half kernel that
    multiplies by one (loaded, widened, computed, rounded, stored): eager's bits."""
    x = _every_pattern(dtype)
    widen = cu.compile(lambda t: t.float(), target="cuda", fallback="error")
    _same_bits(widen(x), x.float())
    once = cu.compile(lambda t: t * 1.0 + 0.0, target="cuda", fallback="error")
    _same_bits(once(x), x * 1.0 + 0.0)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_float32_rounds_to_the_half_type_as_torch_rounds(dtype: torch.dtype) -> None:
    """Ties to even, float16 overflow to inf, subnormals, NaN: the store's rounding is
    torch's (the interpreter's own bfloat16 conversion truncates: ``cu.round_bf16``)."""
    f = cu.compile(lambda t: (t * 1.0).to(dtype), target="cuda", fallback="error")
    y = _edge_floats()
    _same_bits(f(y), (y * 1.0).to(dtype))
    g = cu.compile(lambda t: t.double().to(dtype), target="cuda", fallback="error")
    _same_bits(g(y), y.double().to(dtype))  # through float32, as c10 converts


def _chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # every op rounds to the half type where eager rounds: exact float32 math gives eager's bits
    return torch.where(x > y, (x - 0.1) * y, torch.maximum(x, y) / 3) + x.abs()


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_exact_ops_give_eagers_bits(dtype: torch.dtype) -> None:
    f = cu.compile(_chain, target="cuda", fallback="error")
    for n in (5, 37):
        g = torch.Generator().manual_seed(n)
        x, y = torch.randn(n, 19, generator=g).to(dtype), torch.randn(19, generator=g).to(dtype)
        _same_bits(f(x, y), _chain(x, y))
    assert f.stats.compiles == 1
    assert _report(f).kernels == 1 and _report(f).externs == 0
    (texts,) = _kernels(f).values()
    (store,) = [line for line in texts["triton"].splitlines() if "tl.store(" in line]
    assert ("cu.to_bf16(" if dtype == torch.bfloat16 else ".to(tl.float16)") in store  # 2-byte elements


def _norms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.softmax(x * 0.5, -1),
        F.layer_norm(x, (x.shape[-1],), w, b),
        F.gelu(x + b),
        x.sum(-1),
        x.mean(0),
        torch.logsumexp(x, -1),
        x.amax(-1),
    )


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("width", (24, 5000), ids=("one-tile", "looped"))
def test_row_kernels_compute_in_float32(dtype: torch.dtype, width: int) -> None:
    """Softmax, layer norm, GELU, sums, means, logsumexp and max in one tile and in rows
    longer than a tile (online softmax, two-pass variance): within the half tolerance."""
    f = cu.compile(_norms, target="cuda", fallback="error")
    g = torch.Generator().manual_seed(width)
    args = (
        torch.randn(3, width, generator=g) * 4,
        torch.randn(width, generator=g),
        torch.randn(width, generator=g),
    )
    args = tuple(a.to(dtype) for a in args)
    for got, want in zip(f(*args), _norms(*args)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **TOLERANCES[dtype])
    assert _report(f).externs == 0


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_sums_accumulate_in_float32(dtype: torch.dtype) -> None:
    """A half accumulator stops growing (bfloat16: 256 + 1 == 256); eager's, and ours, is float32."""
    x = torch.ones(2, 3000, dtype=dtype)
    f = cu.compile(lambda t: t.sum(-1), target="cuda", fallback="error")
    _same_bits(f(x), x.sum(-1))
    assert f(x)[0].item() == 3000 if dtype == torch.float16 else f(x)[0].item() == x.sum(-1)[0].item() != 256


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_ptx_for_sm_90_loads_stores_and_converts_the_half_type(dtype: torch.dtype) -> None:
    f = cu.compile(_norms, target="cuda", fallback="error")
    w = torch.randn(16).to(dtype)
    f(torch.randn(4, 16).to(dtype), w, w)
    ptxs = {name: texts["ptx"] for name, texts in _kernels(f).items()}
    for name, ptx in ptxs.items():
        assert ".target sm_90" in ptx, name
        assert re.search(r"ld\.global(\.[a-z0-9]+)*\.(b16|u16)", ptx), f"{name}: no 2-byte load"
        assert re.search(r"st\.global(\.[a-z0-9]+)*\.(b16|u16)", ptx), f"{name}: no 2-byte store"
        assert re.search(ROUNDING[dtype], ptx), f"{name}: no {ROUNDING[dtype]}"


def _softmax_autocast_free(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(F.linear(x, w), -1)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_epilogue_of_a_half_matmul_is_a_half_kernel(dtype: torch.dtype) -> None:
    f = cu.compile(_softmax_autocast_free, target="cuda", fallback="error")
    x, w = torch.randn(6, 8).to(dtype), torch.randn(12, 8).to(dtype)
    torch.testing.assert_close(f(x, w), _softmax_autocast_free(x, w), **TOLERANCES[dtype])
    assert _report(f).kernels == 1 and _report(f).externs == 1


@pytest.mark.slow  # the corpus captured twice per type (the cpu target's twin runs in nox -s tests)
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_half_programs_call_torch_only_where_float32_does(dtype: torch.dtype) -> None:
    half_coverage.check(FUSION, dtype)
