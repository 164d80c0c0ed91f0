"""The C toolchain probe, against the machine's real compiler."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess

import pytest

from cuvil_backend_cpu import aarch64
from cuvil_backend_cpu import toolchain as tc_mod
from cuvil_backend_cpu.toolchain import (
    SIMD_MATH_DECLARATIONS,
    SIMD_MATH_FUNCTIONS,
    IsaError,
    Toolchain,
    ToolchainError,
    check,
    default_kernel_cache_dir,
    find_toolchain,
    isa_flags,
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Probe records go to a temporary cache, and the memoised toolchain is restored afterwards.
    The native ISA unless a test forces one (``nox -s tests_isa`` sets $CUVIL_CPU_ISA for the session)."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUVIL_CPU_ISA", raising=False)
    monkeypatch.setattr(tc_mod, "_toolchain", tc_mod._toolchain)


def test_finds_the_compiler():
    tc = find_toolchain()
    assert isinstance(tc, Toolchain)
    assert os.path.isabs(tc.cc) and os.access(tc.cc, os.X_OK)
    assert tc.version and "\n" not in tc.version
    assert tc.isa in ("avx512", "avx2", "generic", *aarch64.LEVELS)
    if tc.isa in aarch64.LEVELS:  # SVE: the host's vector length (16 bytes at least)
        assert tc.vector_bytes >= 16 and tc.vector_bytes % 16 == 0
    else:
        assert tc.vector_bytes == {"avx512": 64, "avx2": 32, "generic": 16}[tc.isa]
    assert "-O3" in tc.flags and "-fopenmp" in tc.flags and "-shared" in tc.flags
    assert not any("fast-math" in flag for flag in tc.flags)  # masked attention needs inf/nan semantics
    assert tc.libs[-1] == "-lm"
    assert ("-lmvec" in tc.libs) == tc.simd_math


def test_isa_and_simd_math_on_this_machine():
    tc = find_toolchain()
    if platform.machine() == "x86_64":
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
        assert tc.isa == ("avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "generic")
    libc, version = platform.libc_ver()
    if (
        libc == "glibc"
        and tuple(map(int, version.split(".")[:2])) >= (2, 35)
        and platform.machine() == "x86_64"
    ):
        assert tc.simd_math  # libmvec has expf ... log1pf vector variants from glibc 2.35 on
    assert all(f"float {name}(float);" in SIMD_MATH_DECLARATIONS for name in SIMD_MATH_FUNCTIONS)


def test_memoised_and_identity_stable():
    tc = find_toolchain()
    assert find_toolchain() is tc
    again = find_toolchain(refresh=True)
    assert again == tc and again.identity == tc.identity
    for part in (tc.cc, tc.version, tc.isa, "-march=native", *tc.libs):
        assert part in tc.identity


def test_probe_record_on_disk_is_reused(monkeypatch):
    tc = find_toolchain(refresh=True)  # probes and writes the record under $CUVIL_CACHE_DIR
    (record,) = default_kernel_cache_dir().glob("toolchain-*.json")
    data = json.loads(record.read_text())
    assert data["simd_math"] is tc.simd_math and data["cc"] == tc.cc
    assert not list(record.parent.glob(".*.tmp"))
    # A new process (here: a cleared memo) trusts the record instead of probing again.
    record.write_text(json.dumps({**data, "simd_math": not tc.simd_math}))
    monkeypatch.setattr(tc_mod, "_toolchain", None)
    assert find_toolchain().simd_math is (not tc.simd_math)
    # A damaged record is ignored: probe again.
    record.write_text("{not json")
    monkeypatch.setattr(tc_mod, "_toolchain", None)
    assert find_toolchain() == tc


def test_check_is_none_here():
    assert check() is None


def test_explicit_cc_missing(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ToolchainError, match="no C compiler found") as info:
        find_toolchain(refresh=True)
    assert "/nonexistent/bin/cc" in str(info.value) and "set CC=" in str(info.value)
    reason = check()  # the failed refresh is not memoised: check looks again and reports why
    assert isinstance(reason, str) and "no C compiler found" in reason


def test_no_compiler_on_path(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ToolchainError) as info:
        find_toolchain(refresh=True)
    message = str(info.value)
    assert "looked for $CC, cc, gcc, clang on PATH" in message
    assert "install gcc" in message or "xcode-select" in message


def test_cc_from_environment(monkeypatch):
    real = find_toolchain().cc
    monkeypatch.setenv("CC", os.path.basename(real))  # a bare name is looked up on PATH
    assert find_toolchain(refresh=True).cc == real


# -- forcing the ISA: $CUVIL_CPU_ISA ------------------------------------------------------------------------


def _x86_flags() -> set[str]:
    if platform.machine() != "x86_64":
        return set()
    return set(tc_mod.cpuinfo().get("flags", "").split())


def _runnable(isa: str) -> bool:
    need = {"avx512": {"avx512f"}, "avx2": {"avx2", "fma", "f16c", "bmi2", "movbe"}, "portable": set()}[isa]
    return isa == "portable" or (bool(_x86_flags()) and need <= _x86_flags())


def test_forced_isa_changes_flags_identity_and_memo(monkeypatch):
    native = find_toolchain()
    assert native.requested == "native" and "-march=native" in native.flags
    seen = {native.identity}
    for isa, march, width in (("avx2", "-march=x86-64-v3", 32), ("portable", None, 16)):
        if not _runnable(isa):
            continue
        monkeypatch.setenv("CUVIL_CPU_ISA", isa.upper())  # case-insensitive
        tc = find_toolchain()  # a changed request is picked up without refresh=True
        assert (tc.requested, tc.isa, tc.vector_bytes) == (isa, isa, width)
        assert "-march=native" not in tc.flags and tc.flags[0] == "-O3"
        if march:
            assert march in tc.flags
        assert isa in tc.identity and tc.identity not in seen  # never shares a cache key with another ISA
        seen.add(tc.identity)
        assert find_toolchain() is tc
    monkeypatch.delenv("CUVIL_CPU_ISA")
    assert find_toolchain().identity == native.identity


def test_forced_isa_is_part_of_the_kernel_key(monkeypatch, tmp_path):
    if not _runnable("avx2"):
        pytest.skip("this CPU cannot run avx2 kernels")
    from cuvil_backend_cpu.kernel_cache import KernelCache

    source = "int one(void) { return 1; }\n"
    native = KernelCache(root=tmp_path / "k").key(source)
    monkeypatch.setenv("CUVIL_CPU_ISA", "avx2")
    assert KernelCache(root=tmp_path / "k").key(source) != native


@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_forced_isa_code_has_no_wider_instructions(isa, monkeypatch, tmp_path):
    """A forced ISA really builds for it: no AVX-512 (zmm, mask registers) in avx2 code, no AVX at all
    in portable code, and vector math calls the libmvec variant of that width."""
    if not _runnable(isa) or platform.machine() != "x86_64" or shutil.which("objdump") is None:
        pytest.skip("needs an x86-64 CPU that runs this ISA, and objdump")
    monkeypatch.setenv("CUVIL_CPU_ISA", isa)
    tc = find_toolchain()
    source = tmp_path / "k.c"
    decls = tc_mod.SIMD_MATH_DECLARATIONS if tc.simd_math else "#include <math.h>\n"
    source.write_text(
        decls + "void k(const float* restrict x, float* restrict y, long n) {\n"
        "#pragma omp simd\n  for (long i = 0; i < n; ++i) y[i] = expf(x[i]) * 2.0f + x[i];\n}\n"
    )
    out = tmp_path / "k.so"
    subprocess.run(tc.command(source, out), check=True, capture_output=True)
    asm = subprocess.run(["objdump", "-d", str(out)], check=True, capture_output=True, text=True).stdout
    body = asm.split("<k>:", 1)[1].split("\n\n", 1)[0]
    assert "zmm" not in body and "%k1" not in body
    if isa == "avx2":
        assert "ymm" in body
        if tc.simd_math:
            assert "_ZGVdN8v_expf" in body
    else:
        assert "ymm" not in body and "xmm" in body
        if tc.simd_math:
            assert "_ZGVbN4v_expf" in body


def test_unknown_isa_is_an_error(monkeypatch):
    monkeypatch.setenv("CUVIL_CPU_ISA", "avx9000")
    with pytest.raises(
        ToolchainError, match="CUVIL_CPU_ISA='avx9000' is not one of native, avx512, avx2, portable"
    ):
        find_toolchain()
    with pytest.raises(IsaError, match="avx9000"):  # an explicit setting: the check raises (no fallback)
        check()


def test_isa_the_cpu_cannot_run_is_an_error_not_sigill(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    zen3 = {"model name": "AMD EPYC 7763", "flags": "fpu sse2 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"}
    assert isa_flags("native", zen3) == ("avx2", ("-march=native",))
    assert isa_flags("avx2", zen3) == ("avx2", ("-march=x86-64-v3",))
    assert isa_flags("portable", zen3) == ("portable", ("-march=x86-64", "-mtune=generic"))
    with pytest.raises(ToolchainError) as info:
        isa_flags("avx512", zen3)
    message = str(info.value)
    assert "CUVIL_CPU_ISA=avx512" in message and "avx512f" in message and "AMD EPYC 7763" in message
    assert "illegal instruction" in message and "CUVIL_CPU_ISA=avx2" in message
    old = {"model name": "Intel Xeon E5-2670", "flags": "fpu sse2 avx"}
    with pytest.raises(ToolchainError, match="lacks avx2 bmi1 bmi2 f16c fma abm movbe xsave"):
        isa_flags("avx2", old)
    with pytest.raises(ToolchainError, match="/proc/cpuinfo lists no CPU flags"):
        isa_flags("avx2", {})
    # the same through the public entry point and the availability check
    monkeypatch.setattr(tc_mod, "cpuinfo", lambda: zen3)
    monkeypatch.setenv("CUVIL_CPU_ISA", "avx512")
    with pytest.raises(ToolchainError, match="avx512f"):
        find_toolchain()
    with pytest.raises(IsaError, match="avx512f"):
        check()


def test_avx512_kernels_are_built_for_512_bit_vectors(monkeypatch):
    """gcc's tuning for several AVX-512 CPUs (``-march=native`` on Sapphire Rapids, the generic
    ``x86-64-v4``) vectorizes at 256 bits unless told, while the Loop IR plans 64-byte vectors."""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    spr = {
        "model name": "Intel Xeon",
        "flags": "fpu sse2 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave avx512f",
    }
    wide = "-mprefer-vector-width=512"
    assert isa_flags("native", spr) == ("avx512", ("-march=native", wide))
    assert isa_flags("avx512", spr) == ("avx512", ("-march=native", wide))
    assert wide not in isa_flags("avx2", spr)[1] and wide not in isa_flags("portable", spr)[1]
    assert wide in tc_mod.EXPORT_LEVELS["avx512"][0] and wide not in tc_mod.EXPORT_LEVELS["avx2"][0]


def test_x86_isas_on_arm(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert isa_flags("native", {}) == ("armv8-a", ("-march=native",))  # see test_aarch64.py
    assert isa_flags("portable", {}) == ("portable", ("-march=armv8-a",))
    with pytest.raises(ToolchainError, match="needs an x86-64 CPU; this machine is aarch64"):
        isa_flags("avx2", {})
