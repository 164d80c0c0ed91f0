"""The ``cpu`` target's kernels built for each AArch64 level and run under qemu-aarch64
(``CUVIL_CPU_EMULATE=qemu``, :mod:`cuvil_backend_cpu.emulation`): programs through
``cu.compile`` with threads on (in a child process per level, with the settings a user gives:
a process has one ``cpu`` target), the attention kernel, and the emulated process's failures (an
instruction beyond the level, an address for a pointer, a crash and the restart).

Skipped where the cross compiler or qemu is missing; ``nox -s tests_arm64`` installs them
(apt) and also runs the whole program corpus, the row kernels and the attention kernel's own
tests per level (docs/cpu-backend.md, "AArch64")."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cuvil_backend_cpu import aarch64, emulation
from cuvil_backend_cpu import toolchain as tc_mod
from cuvil_backend_cpu.attention import FlashAttention
from cuvil_backend_cpu.emulation import EmulatedLibrary, EmulationError
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.toolchain import Toolchain, find_toolchain

_MISSING = [
    what
    for what, found in (
        (aarch64.CROSS_CC, aarch64.cross_compiler()),
        ("qemu-aarch64", aarch64.qemu()),
    )
    if found is None
]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{' and '.join(_MISSING)} not installed (apt-get install {' '.join(aarch64.APT_PACKAGES)}; "
    "nox -s tests_arm64 does)",
)

LEVELS = list(aarch64.LEVELS)

_PROGRAMS = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import cuvil as cu
    from cuvil_backend_cpu.emulation import EmulatedFunction
    from cuvil_backend_cpu.testing import executable_of

    def f(x, w, ids, d):
        y = F.layer_norm(x.t() * 2 + 1, (x.shape[0],), w) - torch.softmax(x, dim=0).t()
        return F.gelu(y).amax(-1), torch.exp(-y.abs()).sum(0), ids // d

    g = cu.compile(f, target="cpu", fallback="error")
    # 520 x 70 elements is over the parallel threshold (32768): OpenMP threads in the emulated process
    for n in (33, 520):
        x, w = torch.randn(n, 70), torch.randn(n)
        ids, d = torch.randint(-50, 50, (n,)), torch.randint(1, 7, (n,))
        for got, want in zip(g(x, w, ids, d), f(x, w, ids, d)):
            torch.testing.assert_close(got, want)
    assert g.stats.compiles == 1, g.stats
    try:  # the kernel's nonzero return comes back from qemu
        g(x, w, ids, torch.zeros_like(d))
        raise AssertionError("no ZeroDivisionError")
    except ZeroDivisionError:
        pass
    # softmax rows: the sum of scalar expf calls in an `omp simd` reduction, which GCC 12 gets
    # wrong for SVE without the level's workaround ([Note: SVE and GCC 12's omp simd reductions])
    s = cu.compile(lambda x: torch.softmax(x, dim=-1), target="cpu", fallback="error")
    for n in (1, 4, 7):
        x = torch.randn(5, n)
        torch.testing.assert_close(s(x), torch.softmax(x, dim=-1))
    ex = executable_of(g)
    kernels = list(ex._runner.kernels.values())
    assert kernels and all(isinstance(k.fn, EmulatedFunction) and k.tensors for k in kernels)
    print("ran", ex._backend.cache.toolchain.isa, len(kernels))
    """
)


@pytest.mark.parametrize("level", LEVELS)
def test_compiled_programs_run_emulated(level: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    env = {
        **os.environ,
        "CUVIL_CPU_ISA": level,
        "CUVIL_CPU_EMULATE": "qemu",
        "CUVIL_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "emulated-cache"),
        "CUVIL_PROGRESS": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAMS], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split()[:2] == ["ran", level], proc.stdout


def _toolchain(monkeypatch: pytest.MonkeyPatch, level: str) -> Toolchain:
    monkeypatch.setattr(tc_mod, "_toolchain", None)  # found anew here, put back afterwards
    monkeypatch.setenv("CUVIL_CPU_ISA", level)
    monkeypatch.setenv("CUVIL_CPU_EMULATE", "qemu")
    return find_toolchain()


@pytest.fixture(params=LEVELS)
def level_cache(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KernelCache]:
    """A kernel cache building for one level (kernels shared between this file's tests)."""
    tc = _toolchain(monkeypatch, request.param)
    assert tc.isa == request.param and tc.emulator and tc.machine == "aarch64"
    yield KernelCache(tc, tmp_path_factory.getbasetemp() / "emulated-kernels")


def test_attention_kernel_emulated(level_cache: KernelCache) -> None:
    flash = FlashAttention(level_cache)
    assert flash.tile_queries == 8  # NEON: 4 lanes (SVE levels too: GCC vectors of 16 bytes)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 24, generator=g) for n in (37, 53, 53))
    for kw in ({}, {"is_causal": True}, {"attn_mask": torch.rand(37, 53, generator=g) > 0.3}):
        mask = kw.pop("attn_mask", None)
        got = flash(q, k, v, mask, **kw)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw))
    kv = k[:, :2], v[:, :2]  # grouped-query heads, read through strided views
    got = flash(q, *kv, enable_gqa=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, *kv, enable_gqa=True))


_VECTOR_LOOP = """
#include <stdint.h>
void scale(float *restrict y, const float *restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 3.0f + 1.0f;
}
"""


def _scale(lib: EmulatedLibrary) -> emulation.EmulatedFunction:
    fn = lib["scale"]
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


def test_an_instruction_beyond_the_level_is_an_error_not_a_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # SVE2 code on the armv8-a level's emulated CPU (a Cortex-A72, which has no SVE)
    sve2 = _toolchain(monkeypatch, "sve2")
    a72 = _toolchain(monkeypatch, "armv8-a").emulator
    wrong = KernelCache(replace(sve2, emulator=a72), tmp_path / "wrong")
    fn = _scale(wrong.load(wrong.build(_VECTOR_LOOP)))
    x, y = torch.randn(100), torch.zeros(100)
    with pytest.raises(EmulationError, match=r"SIGILL.*sve2 level does not have|Illegal.*sve2 level"):
        fn(y, x, 100)
    assert not y.any()  # nothing was written back
    fn(y, x, 0)  # the server restarts (and reloads the library) for the next call
    with pytest.raises(EmulationError, match="takes tensors, bytes or ctypes objects"):
        fn(y.data_ptr(), x, 100)  # an address of this process means nothing there


def test_memory_round_trip_keeps_views_aliased(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = KernelCache(_toolchain(monkeypatch, "armv8-a"), tmp_path / "k")
    fn = _scale(cache.load(cache.build(_VECTOR_LOOP.replace("restrict ", ""))))
    base = torch.arange(12, dtype=torch.float32)
    fn(base[2:7], base[1:6], 5)  # an in-place, overlapping call: one region, as memory is here
    want = torch.arange(12, dtype=torch.float32)
    for i in range(5):  # the loop's own order: each element reads the one written before it
        want[2 + i] = want[1 + i] * 3 + 1
    torch.testing.assert_close(base, want)


def test_aarch64_artifact_loads_under_emulation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Saved here for sve2 (the cross compiler), refused by cu.load (test_aarch64.py) unless
    CUVIL_CPU_EMULATE=qemu, which runs the artifact's own kernels under qemu."""
    import cuvil as cu

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, dim=-1) + torch.erf(x)

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUVIL_CPU_ISA", raising=False)
    monkeypatch.delenv("CUVIL_CPU_EMULATE", raising=False)
    monkeypatch.setenv("CUVIL_CPU_EXPORT_ISA", "sve2")
    monkeypatch.setattr(tc_mod, "_exporters", {})
    path = cu.save(f, tmp_path / "f.cuvil", torch.randn(4, 8))
    monkeypatch.setenv("CUVIL_CPU_EMULATE", "qemu")
    loaded = cu.load(path)
    for n in (3, 9):
        x = torch.randn(n, 8)
        torch.testing.assert_close(loaded(x), f(x))
    launches = loaded.executable._runner.kernels.values()
    assert launches and all(isinstance(k.fn, emulation.EmulatedFunction) for k in launches)
    assert {k.fn.library._server.toolchain.isa for k in launches} == {"sve2"}
