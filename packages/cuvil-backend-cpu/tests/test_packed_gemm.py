"""The cpu target's packed-weight GEMM (``packed_gemm.c``) against a float64 product: odd sizes
(rows off the register tile, columns off the panel, K off the vector width), one row, strided
rows of x, with and without bias, every tiling (the host's, and 16, 8 and 4 lanes forced in plain
vector arithmetic); the packing cache (a weight written in place is packed again); then through
``cu.compile`` with the GEMM forced to it. ``nox -s tests_isa`` runs this file with
``CUVIL_CPU_ISA=avx2`` and ``portable`` too, ``tests_arm64`` at the NEON and SVE levels."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu import gemm_choice, packed_gemm
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.packed_gemm import PackedGemmKernel


@pytest.fixture(scope="module", params=[None, 16, 8, 4], ids=["host", "lanes16", "lanes8", "lanes4"])
def pg(request: pytest.FixtureRequest) -> PackedGemmKernel:
    if request.param is None:
        return packed_gemm.kernel(KernelCache())
    return PackedGemmKernel(KernelCache(), lanes=request.param)


def _check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    scale = (x.double().abs() @ w.double().abs().t()).max().item() + 1
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=0, atol=4e-6 * scale)


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (1, 37, 5), (5, 3, 33), (7, 100, 64), (13, 129, 70), (30, 64, 257)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_against_float64(pg: PackedGemmKernel, m: int, k: int, n: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(m * 10000 + k * 100 + n)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    x = torch.randn(m, k + 3, generator=g)[:, 1 : k + 1]  # rows strided, not contiguous
    out = torch.full((m, n), float("nan"))
    pg.linear_into(out, x, pg.pack(w), n, b)
    _check(out, x, w, b)


def test_output_rows_strided(pg: PackedGemmKernel) -> None:
    """``out`` a column slice of a wider tensor: only its columns are written."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 40, generator=g), torch.randn(21, 40, generator=g)
    wide = torch.zeros(9, 30)
    pg.linear_into(wide[:, 4:25], x, pg.pack(w), 21, None)
    _check(wide[:, 4:25], x, w, None)
    assert not wide[:, :4].any() and not wide[:, 25:].any()


def test_linear_reshapes_and_packs_once_per_version() -> None:
    pg = packed_gemm.kernel(KernelCache())
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    x = torch.randn(2, 3, 16, generator=g)
    _check(packed_gemm.linear(pg, x, w, b).reshape(6, 24), x.reshape(6, 16), w, b)
    first = pg.packed(w)
    assert pg.packed(w) is first  # the same weight, unchanged: packed once
    with torch.no_grad():
        w.mul_(2.0)  # written in place: a new version, packed again
    assert pg.packed(w) is not first
    _check(packed_gemm.linear(pg, x, w, b).reshape(6, 24), x.reshape(6, 16), w, b)


def test_what_it_does_not_take_is_none() -> None:
    run = packed_gemm.f32_linear(KernelCache())
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    assert run(x.double(), w.double(), None) is None
    assert run(x, w.t().contiguous().t(), None) is None  # a transposed (non-contiguous) weight
    assert run(torch.empty(0, 8), w, None) is None
    assert run(x, w, torch.randn(4)) is None  # a bias of the wrong size: F.linear's error
    got = run(x, w, None)
    assert got is not None
    _check(got, x, w, None)


def test_compiled_linears_forced_to_it_match_eager(private_cache, monkeypatch) -> None:
    """``CUVIL_CPU_GEMM=packed``: every float32 linear runs the packed GEMM (a spy says it ran),
    at several row counts (one compile), and after a weight is written in place."""
    monkeypatch.setenv(gemm_choice.GEMM_ENV, "packed")
    ran: list[tuple[int, int]] = []
    real = PackedGemmKernel.linear_into

    def spy(self, out, x, packed, n, bias, other=None, act="none"):
        ran.append((x.shape[0], n))
        return real(self, out, x, packed, n, bias, other, act)

    monkeypatch.setattr(PackedGemmKernel, "linear_into", spy)
    m = torch.nn.Sequential(
        torch.nn.Linear(48, 80), torch.nn.GELU(), torch.nn.Linear(80, 24, bias=False)
    ).eval()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for rows in (1, 7, 33):
            x = torch.randn(rows, 48)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        m[0].weight.mul_(0.5)
        x = torch.randn(5, 48)
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    assert {n for _, n in ran} == {80, 24}
    assert {r for r, _ in ran} >= {1, 7, 33, 5}
    assert f.stats.compiles == 1


def _act64(y: torch.Tensor, act: str) -> torch.Tensor:
    f = torch.nn.functional
    return {
        "none": lambda: y,
        "relu": lambda: f.relu(y),
        "gelu": lambda: f.gelu(y),
        "gelu_tanh": lambda: f.gelu(y, approximate="tanh"),
        "silu": lambda: f.silu(y),
    }[act]()


@pytest.mark.parametrize("act", list(packed_gemm.ACTIVATIONS))
@pytest.mark.parametrize("with_other", [False, True])
def test_epilogue_against_float64(pg: PackedGemmKernel, act: str, with_other: bool) -> None:
    """``act(x @ W^T + b (+ other))`` in the store: every activation (over inputs from -12 to 12,
    where the approximations' tails matter), with and without the residual, odd sizes, a strided
    residual."""
    m, k, n = 13, 37, 45
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    x = torch.randn(m, k, generator=g) * 0.6
    other = (torch.rand(m, n + 4, generator=g) * 24 - 12)[:, 2 : n + 2] if with_other else None
    out = torch.empty(m, n)
    pg.linear_into(out, x, pg.pack(w), n, b, other, act)
    y = torch.nn.functional.linear(x.double(), w.double(), b.double())
    if other is not None:
        y = y + other.double()
    want = _act64(y, act)
    torch.testing.assert_close(out.double(), want, rtol=2e-6, atol=2e-5)
    assert (y.abs() > 4).any()  # the tails were reached


@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
def test_compiled_epilogues_forced_to_it_match_eager(private_cache, monkeypatch, act: str) -> None:
    """``CUVIL_CPU_GEMM=packed``: a linear followed by its activation, and one followed by a
    residual add (the ``cpu_linear_epilogue`` the cpu target fuses them into, every rule on),
    run the packed GEMM with the epilogue in its store, matching eager."""
    from cuvil_backend_cpu import epilogues

    monkeypatch.setattr(epilogues, "ENABLED", frozenset(epilogues.RULES))
    monkeypatch.setenv(gemm_choice.GEMM_ENV, "packed")
    ran: list[tuple[str, bool]] = []
    real = PackedGemmKernel.linear_into

    def spy(self, out, x, packed, n, bias, other=None, act="none"):
        ran.append((act, other is not None))
        return real(self, out, x, packed, n, bias, other, act)

    monkeypatch.setattr(PackedGemmKernel, "linear_into", spy)
    acts = {"gelu": torch.nn.GELU(), "relu": torch.nn.ReLU(), "silu": torch.nn.SiLU()}

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.act, self.down = torch.nn.Linear(64, 256), acts[act], torch.nn.Linear(256, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(self.act(self.up(x)))

    m = Block().eval()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for rows in (64, 100):
            x = torch.randn(rows, 64)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (act, False) in ran and ("none", True) in ran


def test_rows_past_one_block_of_x(pg: PackedGemmKernel) -> None:
    """More rows than one block of x holds (about 256 KiB: here 300 rows of K = 300, two blocks
    of equal size), with the residual and an activation: every row and column once."""
    g = torch.Generator().manual_seed(11)
    m, k, n = 300, 300, 40
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    other = torch.randn(m, n, generator=g)
    out = torch.full((m, n), float("nan"))
    pg.linear_into(out, x, pg.pack(w), n, b, other, "relu")
    want = torch.relu(torch.nn.functional.linear(x.double(), w.double(), b.double()) + other.double())
    torch.testing.assert_close(out.double(), want, rtol=2e-6, atol=2e-4)


def test_pack_kn_against_float64(pg: PackedGemmKernel) -> None:
    """A weight stored ``[K, N]`` (the right operand of ``x @ W``) packs to the same panels."""
    g = torch.Generator().manual_seed(13)
    k, n = 37, 45
    w_kn = torch.randn(k, n, generator=g)
    assert torch.equal(pg.pack(w_kn, kn=True), pg.pack(w_kn.t().contiguous()))
    x = torch.randn(9, k, generator=g)
    out = torch.empty(9, n)
    pg.linear_into(out, x, pg.pack(w_kn, kn=True), n, None)
    _check(out, x, w_kn.t(), None)


def test_compiled_matmul_of_a_parameter_forced_to_it(private_cache, monkeypatch) -> None:
    """``CUVIL_CPU_GEMM=packed``: ``x @ W`` for a parameter ``W`` (GPT-2's ``Conv1D``) runs the
    packed GEMM; a product of two activations does not (it would be packed at every call)."""
    monkeypatch.setenv(gemm_choice.GEMM_ENV, "packed")
    ran: list[int] = []
    real = PackedGemmKernel.linear_into

    def spy(self, out, x, packed, n, bias, other=None, act="none"):
        ran.append(n)
        return real(self, out, x, packed, n, bias, other, act)

    monkeypatch.setattr(PackedGemmKernel, "linear_into", spy)

    class Conv1D(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(48, 72) * 0.1)
            self.bias = torch.nn.Parameter(torch.randn(72))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x @ self.weight + self.bias
            return y @ y.transpose(-1, -2)  # activations only: not packed

    m = Conv1D().eval()
    f = cu.compile(m, target="cpu", fallback="error")
    with torch.no_grad():
        for shape in ((2, 5, 48), (3, 48)):
            x = torch.randn(*shape)
            got, want = f(x), m(x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert ran and set(ran) == {72}
