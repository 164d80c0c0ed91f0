"""The AArch64 ISA levels (``cuvil_backend_cpu.aarch64``) as the toolchain resolves them:
on a (pretended) AArch64 host from its /proc/cpuinfo ``Features``, refused on another machine
with what to do instead, and the cache-derived tile sizes; artifacts saved for a level here
(with the cross compiler, when installed) and refused by ``cu.load`` on the wrong machine or
CPU. ``test_emulated.py`` runs the levels' code under qemu."""

from __future__ import annotations

import json
import platform
import zipfile
from pathlib import Path

import pytest
import torch

import cuvil as cu
from cuvil.aot import ArtifactError
from cuvil_backend_cpu import aarch64
from cuvil_backend_cpu import aot as aot_mod
from cuvil_backend_cpu import toolchain as tc_mod
from cuvil_backend_cpu.emulation import trampoline_source
from cuvil_backend_cpu.toolchain import (
    ISA_CHOICES,
    IsaError,
    emulation_requested,
    export_cpu_flags,
    export_isa,
    isa_flags,
)

#: /proc/cpuinfo Features of real CPUs, one per level (Cortex-A72, Neoverse N1, V1, N2)
A72 = "fp asimd evtstrm crc32 cpuid"
N1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
V1 = (
    N1 + " sha3 sm3 sm4 sha512 sve asimdfhm dit uscat ilrcpc flagm paca pacg dcpodp svei8mm svebf16 i8mm bf16"
)
N2 = V1 + " sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint"
HOSTS = {"armv8-a": A72, "armv8.2-a": N1, "sve": V1, "sve2": N2}


@pytest.fixture
def arm_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")


def _info(features: str) -> dict[str, str]:
    return {"processor": "0", "Features": features, "CPU implementer": "0x41", "CPU part": "0xd0c"}


def test_levels_are_isa_choices_and_nest() -> None:
    names = list(aarch64.LEVELS)
    assert names == ["armv8-a", "armv8.2-a", "sve", "sve2"]
    assert set(names) <= set(ISA_CHOICES)
    for lower, upper in zip(names, names[1:]):  # each level needs everything the one below needs
        assert set(aarch64.LEVELS[lower].features) < set(aarch64.LEVELS[upper].features)
    assert [aarch64.LEVELS[n].scalable for n in names] == [False, False, True, True]


@pytest.mark.parametrize("level", list(aarch64.LEVELS))
def test_best_level_of_real_cpus(level: str) -> None:
    assert aarch64.best_level(_info(HOSTS[level])) == level


def test_native_on_arm_is_the_best_level(arm_host: None) -> None:
    assert isa_flags("native", _info(N1)) == ("armv8.2-a", ("-march=native",))
    # no Features listed (a restricted /proc): Advanced SIMD is mandatory on AArch64 Linux
    assert isa_flags("native", {}) == ("armv8-a", ("-march=native",))


@pytest.mark.parametrize("level", list(aarch64.LEVELS))
def test_forced_level_on_a_cpu_that_runs_it(arm_host: None, level: str) -> None:
    assert isa_flags(level, _info(N2)) == (level, aarch64.LEVELS[level].flags)


def test_forced_level_this_cpu_lacks_names_the_features_and_what_runs(arm_host: None) -> None:
    with pytest.raises(IsaError) as e:
        isa_flags("sve", _info(N1))
    message = str(e.value)
    assert "CUVIL_CPU_ISA=sve" in message and "lacks sve" in message
    assert "illegal instruction" in message
    assert "CUVIL_CPU_ISA=armv8-a or CUVIL_CPU_ISA=armv8.2-a or CUVIL_CPU_ISA=portable" in message
    with pytest.raises(IsaError, match="lacks atomics asimdrdm fphp asimdhp asimddp"):
        isa_flags("armv8.2-a", _info(A72))


def test_aarch64_level_on_x86_says_how_to_build_or_emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    with pytest.raises(IsaError) as e:
        isa_flags("armv8.2-a", {"flags": "avx2 fma"})
    message = str(e.value)
    assert "this machine is x86_64" in message
    assert "CUVIL_CPU_EXPORT_ISA=armv8.2-a" in message and "CUVIL_CPU_EMULATE=qemu" in message
    assert "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user" in message


def test_emulate_takes_only_qemu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUVIL_CPU_EMULATE", raising=False)
    assert not emulation_requested()
    monkeypatch.setenv("CUVIL_CPU_EMULATE", "QEMU")
    assert emulation_requested()
    monkeypatch.setenv("CUVIL_CPU_EMULATE", "bochs")
    with pytest.raises(IsaError, match="CUVIL_CPU_EMULATE='bochs' is not qemu"):
        emulation_requested()


def test_export_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    # on another machine an AArch64 level is built as asked (the cross compiler's; nothing runs)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert export_isa("sve", {"flags": "avx2"}) == ("sve", aarch64.LEVELS["sve"].flags)
    assert export_cpu_flags("sve") == aarch64.LEVELS["sve"].features
    # on an AArch64 host its own best level, by name, never -march=native
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert export_isa("native", _info(V1)) == ("sve", aarch64.LEVELS["sve"].flags)
    assert export_isa("portable", _info(V1)) == ("portable", ("-march=armv8-a",))


def test_tile_sizes() -> None:
    assert aarch64.tile_size(aarch64.Caches(32 << 10, 1 << 20)) == 32  # as measured on x86-64
    assert aarch64.tile_size(aarch64.Caches(64 << 10, 1 << 20)) == 32
    assert aarch64.tile_size(aarch64.Caches(128 << 10, 4 << 20, line=128)) == 64  # Apple's cores
    assert aarch64.tile_size(aarch64.Caches(8 << 10, 128 << 10)) == 16  # a small core: one line per row
    # every level's default gives today's block, so emulated code is the code an x86 host tiles
    assert {aarch64.tile_size(lv.caches) for lv in aarch64.LEVELS.values()} == {32}


def _cache_dir(root: Path, index: int, level: str, kind: str, size: str, line: str = "64") -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    for name, text in (("level", level), ("type", kind), ("size", size), ("coherency_line_size", line)):
        (d / name).write_text(text + "\n")


def test_host_caches_from_sysfs(tmp_path: Path) -> None:
    default = aarch64.Caches(32 << 10, 512 << 10)
    assert aarch64.host_caches(default, tmp_path / "none") == default
    _cache_dir(tmp_path, 0, "1", "Data", "128K", "128")
    _cache_dir(tmp_path, 1, "1", "Instruction", "192K", "128")
    _cache_dir(tmp_path, 2, "2", "Unified", "12288K", "128")
    assert aarch64.host_caches(default, tmp_path) == aarch64.Caches(128 << 10, 12 << 20, 128)


def test_sve_vector_length_from_the_host(tmp_path: Path) -> None:
    sve, neon = aarch64.LEVELS["sve"], aarch64.LEVELS["armv8.2-a"]
    (tmp_path / "vl").write_text("32\n")
    assert aarch64.host_vector_bytes(sve, tmp_path / "vl") == 32
    assert aarch64.host_vector_bytes(neon, tmp_path / "vl") == 16  # NEON is 128-bit everywhere
    assert aarch64.host_vector_bytes(sve, tmp_path / "missing") == 16  # the architectural minimum


def test_identity_names_the_tile_and_the_emulator() -> None:
    base = tc_mod.Toolchain("/cc", "gcc 12", "sve", ("-O3",), ("-lm",), False, 16, "cpu")
    assert "tile" not in base.identity and "qemu" not in base.identity
    other = tc_mod.Toolchain(
        "/cc", "gcc 12", "sve", ("-O3",), ("-lm",), False, 16, "cpu", tile_size=64, emulator=("qemu-aarch64",)
    )
    assert "tile 64" in other.identity and "qemu-aarch64" in other.identity
    assert base.machine == "aarch64"


def test_trampoline_source_calls_in_the_kernels_types() -> None:
    import ctypes

    text = trampoline_source(
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_double, ctypes.c_uint8],
        ctypes.c_int,
    )
    assert "typedef int32_t (*cuvil_fn)(void *, int64_t, float, void *, double, uint8_t);" in text
    assert "return (int)((cuvil_fn)fn)((void *)p[0], (int64_t)i[0], (float)d[0], (void *)p[1], " in text
    assert "(double)d[1], (uint8_t)i[1]);" in text
    void = trampoline_source([ctypes.c_void_p], None)
    assert "typedef void (*cuvil_fn)(void *);" in void and "return 0;" in void


# -- artifacts ---------------------------------------------------------------------------------------------


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2, dim=-1)


def _manifest(path: Path) -> dict[str, object]:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("manifest.json"))  # type: ignore[no-any-return]


def _save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, export: str | None) -> Path:
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUVIL_CPU_ISA", raising=False)
    monkeypatch.setattr(tc_mod, "_exporters", {})  # found anew for this setting
    monkeypatch.delenv("CUVIL_CPU_EMULATE", raising=False)
    if export is None:
        monkeypatch.delenv("CUVIL_CPU_EXPORT_ISA", raising=False)
    else:
        monkeypatch.setenv("CUVIL_CPU_EXPORT_ISA", export)
    return cu.save(_softmax, tmp_path / f"{export or 'host'}.cuvil", torch.randn(4, 8))


@pytest.mark.skipif(
    aarch64.is_aarch64(platform.machine()), reason="checks an AArch64 artifact on another machine"
)
@pytest.mark.skipif(
    aarch64.cross_compiler() is None, reason="needs gcc-aarch64-linux-gnu (nox -s tests_arm64)"
)
def test_artifact_for_an_aarch64_level_is_refused_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path, monkeypatch, "sve")
    requires = _manifest(path)["requires"]
    assert isinstance(requires, dict)
    assert requires["machine"] == "aarch64" and requires["isa"] == "sve"
    assert requires["cpu_flags"] == list(aarch64.LEVELS["sve"].features)
    with zipfile.ZipFile(path) as z:
        kernels = [z.read(n) for n in z.namelist() if n.startswith("files/")]
    # ELF, 64-bit, little-endian, e_machine 183 (EM_AARCH64): the cross compiler's, not the host's
    assert kernels and all(
        k[:5] == b"\x7fELF\x02" and int.from_bytes(k[18:20], "little") == 183 for k in kernels
    )
    with pytest.raises(ArtifactError) as e:
        cu.load(path)
    message = str(e.value)
    assert f"built for aarch64 (sve), and this machine is {platform.machine().lower()}" in message
    assert "save the artifact again on this machine, or with CUVIL_CPU_EXPORT_ISA=" in message
    assert "CUVIL_CPU_EMULATE=qemu" in message  # (test_emulated.py loads one so)
    # on an AArch64 host that has SVE it passes the check; on one without, the check names sve
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(aot_mod, "cpuinfo", lambda: _info(V1))
    assert aot_mod.CpuLoader().check(requires) is None
    monkeypatch.setattr(aot_mod, "cpuinfo", lambda: _info(N1))
    problem = aot_mod.CpuLoader().check(requires)
    assert problem is not None and "this CPU lacks sve" in problem
    assert (
        "CUVIL_CPU_EXPORT_ISA=armv8-a or CUVIL_CPU_EXPORT_ISA=armv8.2-a or CUVIL_CPU_EXPORT_ISA=portable"
        in problem
    )


def test_host_artifact_is_refused_on_an_aarch64_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if aarch64.is_aarch64(platform.machine()):
        pytest.skip("pretends to be an AArch64 host: this one is")
    path = _save(tmp_path, monkeypatch, None)
    machine = platform.machine().lower()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(aot_mod, "cpuinfo", lambda: _info(N2))
    with pytest.raises(ArtifactError) as e:
        cu.load(path)
    message = str(e.value)
    assert f"its kernels are built for {machine} (" in message and "this machine is aarch64" in message
    assert "CUVIL_CPU_EXPORT_ISA=sve2 or CUVIL_CPU_EXPORT_ISA=portable" in message
