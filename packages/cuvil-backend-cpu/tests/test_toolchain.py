"""The C toolchain probe, against the machine's real compiler."""

from __future__ import annotations

import json
import os
import platform

import pytest

from cuvil_backend_cpu import toolchain as tc_mod
from cuvil_backend_cpu.toolchain import (
    SIMD_MATH_DECLARATIONS,
    SIMD_MATH_FUNCTIONS,
    Toolchain,
    ToolchainError,
    check,
    default_kernel_cache_dir,
    find_toolchain,
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Probe records go to a temporary cache, and the memoised toolchain is restored afterwards."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tc_mod, "_toolchain", tc_mod._toolchain)


def test_finds_the_compiler():
    tc = find_toolchain()
    assert isinstance(tc, Toolchain)
    assert os.path.isabs(tc.cc) and os.access(tc.cc, os.X_OK)
    assert tc.version and "\n" not in tc.version
    assert tc.isa in ("avx512", "avx2", "neon", "generic")
    assert tc.vector_bytes == {"avx512": 64, "avx2": 32, "neon": 16, "generic": 16}[tc.isa]
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
