"""The ``cpu`` target's weight-only linear kernels (``quant_linear.c``) against a
dequantize-then-matmul reference computed in float64, independent of the library's own
dequantization: odd sizes (K and N off the vector width, and off the group where the format
allows), M = 1, 3, 17, with and without bias, strided activations, the GEMV and the
dequantize + GEMM paths, every tiling (the host's, and 16, 8 and 4 lanes forced in plain vector
arithmetic); then through ``cu.compile`` with ``fallback="error"``. ``nox -s tests_isa`` runs this
file with ``CUVIL_CPU_ISA=avx2`` and ``portable`` too (the AVX2 intrinsics and the SSE2 code)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import cuvil as cu
import cuvil.api
from cuvil_backend_cpu import quant_linear
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.quant_linear import QuantLinearKernel
from cuvil_backend_cpu.testing import Weight, native_runs_here, native_runs_used
from cuvil_ir.graph_ir.ops import quant
from cuvil_ir.graph_ir.ops.quant import QuantFormatError, weight_only_linear
from cuvil_runtime.cache import CompileCache


@pytest.fixture(scope="module", params=[None, 16, 8, 4], ids=["host", "lanes16", "lanes8", "lanes4"])
def ql(request: pytest.FixtureRequest) -> QuantLinearKernel:
    """The host's kernel, and kernels with 16, 8 and 4 lanes forced (the AVX-512, AVX2 and
    SSE/NEON tilings in plain vector arithmetic), so every host checks every tiling's logic."""
    if request.param is None:
        return quant_linear.kernel(KernelCache())
    return QuantLinearKernel(KernelCache(), lanes=request.param)


#: (fmt, N, K, group): K and N off every vector width; int4's K a whole number of groups
SIZES = [
    ("bf16", 5, 37, 0),
    ("bf16", 33, 200, 0),
    ("int8", 7, 37, 0),
    ("int8", 9, 130, 0),
    ("int4", 5, 96, 32),
    ("int4", 7, 192, 64),
    ("int4", 9, 384, 128),
    ("int4", 6, 256, 256),
    ("int4-a8", 5, 96, 32),
    ("int4-a8", 7, 192, 64),
    ("int4-a8", 9, 384, 128),
]


@pytest.mark.parametrize("fmt,n,k,group", SIZES)
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_against_float64(
    ql: QuantLinearKernel, fmt: str, n: int, k: int, group: int, m: int, with_bias: bool
) -> None:
    w = Weight(fmt, n, k, group)
    g = torch.Generator().manual_seed(1)
    bias = torch.randn(n, generator=g) if with_bias else None
    x = torch.randn(m, k + 5, generator=g)[:, 2 : k + 2]  # rows strided, not contiguous
    out = torch.empty(m, n)
    ql.gemv(out, x, w.weight, *_two(w.params()), bias, fmt=fmt, group_size=group)
    w.check(out, x, bias)


def _two(params: tuple[torch.Tensor, ...]) -> tuple[Any, Any]:
    return (params + (None, None))[:2]  # (scales, zeros), None where the format has none


@pytest.mark.parametrize("fmt,n,k,group", [SIZES[1], SIZES[3], SIZES[5], SIZES[9]])
def test_gemm_path_in_panels(
    ql: QuantLinearKernel, fmt: str, n: int, k: int, group: int, monkeypatch: Any
) -> None:
    """More rows than the GEMV takes: the weight dequantized in panels (three of them here),
    each multiplied by torch's GEMM into its columns of the output."""
    monkeypatch.setattr(quant_linear, "PANEL_BYTES", 4 * k * 3)  # three rows of W a panel
    w = Weight(fmt, n, k, group)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(ql.gemv_max_rows + 3, k, generator=g)
    bias = torch.randn(n, generator=g)
    out = torch.empty(x.shape[0], n)
    ql.linear_into(out, x, w.weight, *_two(w.params()), bias, fmt=fmt, group_size=group)
    w.check(out, x, bias)


@pytest.mark.parametrize("fmt,n,k,group", [SIZES[0], SIZES[2], SIZES[4]])
def test_dequantize_kernel(ql: QuantLinearKernel, fmt: str, n: int, k: int, group: int) -> None:
    w = Weight(fmt, n, k, group)
    got = ql.dequantize(w.weight, *_two(w.params()), fmt=fmt, group_size=group)
    torch.testing.assert_close(got.double(), w.w64, rtol=1e-6, atol=1e-7)


def test_activations_round_as_the_reference_rounds_them(ql: QuantLinearKernel) -> None:
    """int4-a8: the kernel's int8 codes and block scales are torch's reference's, bit for bit
    (ties to even, an all-zero block, a block's largest value at +-127, NaN and infinity making
    their block NaN), for strided rows."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 160 + 3, generator=g)[:, 1:161] * 3
    x[0, :32] = 0.0  # all zero: scale 0, codes 0
    x[1, :32] = torch.arange(32) - 15.5  # max 16.5: codes at x * 127 / 16.5, several ties near .5
    x[1, 32:64] = torch.tensor([127.0, -0.5, 0.5, 1.5, 2.5] + [0.0] * 27)  # scale 1: exact ties
    x[2, 40] = float("nan")
    x[3, 100] = float("-inf")
    x[4, 64:96] = torch.linspace(-1e-36, 1e-36, 32)  # a scale under float32's smallest normal: codes 0
    x[4, 128:160] = torch.linspace(-3e-36, 2e-36, 32)  # just above it: rounded as usual
    got = ql.round_activations(x)
    want = quant.round_activations(x)
    assert torch.equal(got.isnan(), want.isnan())
    assert got.isnan()[2, 32:64].all() and got.isnan()[3, 96:128].all() and not got.isnan()[2, :32].any()
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=0, atol=0)
    assert got[1, 32:37].tolist() == [127.0, -0.0, 0.0, 2.0, 2.0]  # round half to even
    assert (got[4, 64:96] == 0).all() and (got[4, 128:160] != 0).any()
    with pytest.raises(ValueError, match="not a multiple of 32"):
        ql.round_activations(torch.randn(2, 48))


def test_transposed_and_batched_activations_through_the_out_variant() -> None:
    """What compiled code calls: any leading dims, a transposed (inner stride > 1) input copied."""
    run = quant_linear.out_variant(KernelCache())
    w = Weight("int4", 9, 128, 32)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(128, 6, generator=g).t().reshape(2, 3, 128)  # (a copy: reshape of a transpose)
    xt = torch.randn(128, 4, generator=g).t()  # inner stride 4
    for inp in (x, xt):
        out = torch.empty(*inp.shape[:-1], 9)
        run(out, inp, w.weight, *w.params(), fmt="int4", group_size=32, has_bias=False)
        w.check(out.reshape(-1, 9), inp.reshape(-1, 128), None)


def test_bad_input_is_a_clear_error() -> None:
    x = torch.randn(2, 64)
    q = torch.zeros(4, 32, dtype=torch.uint8)
    s = torch.ones(4, 2)
    with pytest.raises(QuantFormatError, match="group size 48 is not one of 32, 64, 128, 256"):
        weight_only_linear(x, q, s, s, fmt="int4", group_size=48)
    with pytest.raises(QuantFormatError, match="int4-a8 group size 16 is not one of"):
        weight_only_linear(x, q, s, s, fmt="int4-a8", group_size=16)
    with pytest.raises(QuantFormatError, match="not a whole number of groups of 128"):
        weight_only_linear(x, q, torch.ones(4, 0), torch.ones(4, 0), fmt="int4", group_size=128)
    with pytest.raises(QuantFormatError, match="int8 weights are 2-d torch.int8 tensors"):
        weight_only_linear(x, q, s, fmt="int8")
    with pytest.raises(QuantFormatError, match="unknown format 'int3'"):
        weight_only_linear(x, q, fmt="int3")
    with pytest.raises(QuantFormatError, match=r"int4 zeros must be float32 of shape \(4, 2\)"):
        weight_only_linear(x, q, s, None, fmt="int4", group_size=32)


# -- through cu.compile ---------------------------------------------------------------------------


class _Spy:
    """Counts the kernel's GEMV calls (and makes them)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.calls = 0
        real = QuantLinearKernel.gemv

        def gemv(this: QuantLinearKernel, *args: Any, **kw: Any) -> None:
            self.calls += 1
            real(this, *args, **kw)

        monkeypatch.setattr(QuantLinearKernel, "gemv", gemv)


def _native(native: bool, monkeypatch: Any) -> None:
    """Wrappers made from now on with native runs on or off ([Note: native runs])."""
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())


@pytest.mark.parametrize("native", [True, False], ids=["native-runs", "python-steps"])
@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4", "int4-a8"])
@torch.no_grad()
def test_compiled_model_runs_the_kernel(fmt: str, native: bool, monkeypatch: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(96, 64), torch.nn.SiLU(), torch.nn.Linear(64, 40, bias=False), torch.nn.ReLU()
    ).eval()
    cu.quantize(model, fmt, group_size=32)
    spy = _Spy(monkeypatch)
    _native(native, monkeypatch)
    f = cu.compile(model, target="cpu", fallback="error")
    used = []
    for shape in ((1, 96), (3, 7, 96), (17, 96)):
        x = torch.randn(*shape)
        for _ in range(2):  # (with native runs: a binding's first call from Python, then natively)
            torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-5)
        used += [v for vs in native_runs_used(f).values() for v in vs]
    if (
        native and native_runs_here()
    ):  # the second call of every binding (at most 21 rows): the step runner called the GEMV
        assert spy.calls == 6 and used and all(used), (spy.calls, used)
    else:
        assert spy.calls == 12 and not used, "the cpu target did not run its kernel"
    assert f.stats.compiles == 2 and f.stats.fallbacks == 0, f.stats.recompile_reasons  # 2-d and 3-d
    text = f.artifacts[-1].executable.stages["tensor_ir"]
    assert "weight_only_linear(" in text and f'fmt = "{fmt}"' in text


@torch.no_grad()
def test_saved_and_loaded_model_keeps_its_quantized_weights(tmp_path: Any, monkeypatch: Any) -> None:
    """The packed weights travel in the artifact; loaded on a host with a C compiler, the op
    runs the kernel (built by that host's kernel cache)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 8)).eval()
    cu.quantize(model, "int4", group_size=32)
    x = torch.randn(2, 64)
    path = cu.save(model, tmp_path / "q.cuvil", x)
    spy = _Spy(monkeypatch)
    for native in (True, False):
        _native(native, monkeypatch)
        loaded = cu.load(path)
        spy.calls = 0
        for _ in range(2):
            torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)
        if native and native_runs_here():  # the second call: the step runner called both GEMVs
            assert spy.calls == 2 and list(native_runs_used(loaded).values()) == [[True]]
        else:
            assert spy.calls == 4 and native_runs_used(loaded) == {}
        torch.testing.assert_close(loaded(torch.randn(5, 64)).shape, torch.Size([5, 8]))


_LOAD_WITHOUT_COMPILER = """
import sys, torch, cuvil as cu
from cuvil_backend_cpu import quant_linear
from cuvil_backend_cpu.kernel_cache import built
loaded = cu.load(sys.argv[1])
x, want = torch.load(sys.argv[2])
with torch.no_grad():
    torch.testing.assert_close(loaded(x), want, rtol=1e-5, atol=1e-5)
print("ok", "kernel" if built(quant_linear.QuantLinearKernel) else "reference")
"""


@torch.no_grad()
def test_loaded_artifact_without_a_compiler_runs_the_reference(tmp_path: Any) -> None:
    """A host with no C compiler loads the artifact and runs the op's reference (a host with
    one builds the kernel: the test above)."""
    import os
    import subprocess
    import sys

    if os.environ.get("CUVIL_CPU_EMULATE"):
        pytest.skip("emulated AArch64 kernels need the cross compiler to run at all (nox -s tests_arm64)")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).eval()
    cu.quantize(model, "int8")
    x = torch.randn(3, 64)
    path = cu.save(model, tmp_path / "q.cuvil", x)
    torch.save((x, model(x)), tmp_path / "io.pt")
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_COMPILER, str(path), str(tmp_path / "io.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "reference"]
