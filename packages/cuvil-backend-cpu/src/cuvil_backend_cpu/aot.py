"""Loading the ``cpu`` target's ahead-of-time artifacts, with no C compiler.

``cu.save`` asks :meth:`cuvil_backend_cpu.target.CpuTarget.export` for the program
and one shared object per kernel, built for a named ISA level
(:data:`cuvil_backend_cpu.toolchain.EXPORT_LEVELS`). ``cu.load`` makes a
:class:`CpuLoader` (``BackendSpec.loader``), which checks that this host can run
those binaries (the machine, the ISA's CPU flags, the shared libraries they link)
before anything is loaded, then loads each verified binary from a folder only this
process uses (:func:`cuvil_backend_cpu.kernel_cache.load_library`). An AArch64 artifact
on another machine is refused, unless ``$CUVIL_CPU_EMULATE=qemu`` asks to run its kernels
under qemu-aarch64 (tests: :mod:`cuvil_backend_cpu.emulation`).
"""

from __future__ import annotations

import ctypes.util
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil_backend_cpu import aarch64, emulation
from cuvil_backend_cpu.codegen import CKernel
from cuvil_backend_cpu.kernel_cache import KernelCache, load_library
from cuvil_backend_cpu.target import CpuHooks, launch
from cuvil_backend_cpu.toolchain import (
    EMULATE_ENV,
    EXPORT_ISA_ENV,
    Toolchain,
    ToolchainError,
    cpuinfo,
    emulation_toolchain,
    export_cpu_flags,
)
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_runtime import trust
from cuvil_runtime.pipeline import ProgramExecutable, load_program
from cuvil_runtime.target import Exported, Launch


class CpuLoader(CpuHooks):
    def __init__(self) -> None:
        self._folder: Path | None = None

    def check(self, requires: Mapping[str, Any]) -> str | None:
        machine = platform.machine().lower()
        want = str(requires.get("machine", ""))
        info = cpuinfo()
        if not _same_machine(want, machine):
            try:
                if _emulator(requires) is not None:
                    return None  # $CUVIL_CPU_EMULATE: run under qemu (the level's CPU, its libraries)
            except ToolchainError as e:
                return f"its kernels are built for {want} ({requires.get('isa')}), and emulating them failed: {e}"
            emulate = (
                f" (to run it here under qemu-aarch64, for tests: {EMULATE_ENV}=qemu)"
                if aarch64.is_aarch64(want)
                else ""
            )
            return (
                f"its kernels are built for {want or 'an unknown machine'} ({requires.get('isa')}), and this "
                f"machine is {machine}: they cannot run here; save the artifact again on this machine, "
                f"or with {_levels_hint(machine, info)}{emulate}"
            )
        # /proc/cpuinfo's feature list: "flags" on x86-64, "Features" on AArch64
        have = set(info.get("flags", "").split()) | aarch64.features(info)
        missing = [f for f in requires.get("cpu_flags", ()) if f not in have]
        if missing:
            return (
                f"its kernels are built for {requires.get('isa')}, and this CPU lacks {' '.join(missing)} "
                f"(they would die with an illegal instruction); save the artifact again with "
                f"{_levels_hint(machine, info)}"
            )
        absent = [lib for lib in requires.get("libraries", ()) if not library_present(str(lib))]
        if absent:
            return f"its kernels need the shared libraries {', '.join('lib' + a for a in absent)}, not found here"
        return None

    def load(self, graph: Graph, exported: Exported) -> ProgramExecutable:
        tc = _emulator(exported.requires)
        return load_program(self if tc is None else _EmulatedLoader(tc), graph, exported)

    def launches(self, kernels: Sequence[tuple[str, CKernel, bytes]]) -> list[Launch]:
        if self._folder is None:
            self._folder = trust.private_dir("aot")
        return [
            launch(load_library(blob, self._folder, name, f"kernel {name!r} of the artifact"), ck)
            for name, ck, blob in kernels
        ]


class _EmulatedLoader(CpuLoader):
    """An AArch64 artifact's kernels loaded under qemu on another machine (``$CUVIL_CPU_EMULATE=qemu``,
    tests): as the emulated ``cpu`` target loads its own (:mod:`cuvil_backend_cpu.emulation`)."""

    def __init__(self, toolchain: Toolchain) -> None:
        super().__init__()
        self._cache = KernelCache(toolchain)  # builds the calls' trampolines

    def launches(self, kernels: Sequence[tuple[str, CKernel, bytes]]) -> list[Launch]:
        folder = trust.private_dir("aot")
        tc = self._cache.toolchain
        return [
            launch(
                emulation.load_library(
                    tc, blob, folder, name, f"kernel {name!r} of the artifact", self._cache._trampoline
                ),
                ck,
            )
            for name, ck, blob in kernels
        ]


def library_present(name: str) -> bool:
    """Whether ``lib<name>`` can be linked here: already mapped into this process (torch's
    own libgomp: the loader then reuses it for our kernels), a file of that name in the
    dynamic linker's default folders, or else what ``ctypes.util.find_library`` says.
    (``find_library`` runs ``ldconfig -p`` in a subprocess, 60 ms a library on a loaded host,
    which a first ``cu.load`` paid three times.)"""
    prefixes = (f"lib{name}.so", f"lib{name}-")  # (a wheel's bundled copy: libgomp-<hash>.so.1)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                base = line.rpartition("/")[2].rstrip()
                if base.startswith(prefixes) and ".so" in base:
                    return True
    except OSError:
        pass
    m = platform.machine()
    for folder in (
        "/lib",
        "/usr/lib",
        "/lib64",
        "/usr/lib64",
        f"/lib/{m}-linux-gnu",
        f"/usr/lib/{m}-linux-gnu",
    ):
        if any(Path(folder).glob(f"lib{name}.so*")):
            return True
    return ctypes.util.find_library(name) is not None


def _emulator(requires: Mapping[str, Any]) -> Toolchain | None:
    """The toolchain that runs an AArch64 artifact's kernels under qemu here, if asked for."""
    if not aarch64.is_aarch64(str(requires.get("machine", ""))):
        return None
    return emulation_toolchain(str(requires.get("isa", "")))


def _same_machine(want: str, machine: str) -> bool:
    return want == machine or (aarch64.is_aarch64(want) and aarch64.is_aarch64(machine))


def _levels_hint(machine: str, info: dict[str, str]) -> str:
    """The ``CUVIL_CPU_EXPORT_ISA`` values whose kernels this CPU runs (for older CPUs: a lower level)."""
    if aarch64.is_aarch64(machine):
        runs = [name for name in aarch64.LEVELS if not aarch64.missing(name, info)] or ["armv8-a"]
    else:
        runs = [name for name in ("avx512", "avx2") if not _lacks(name, info)]
    return " or ".join(f"{EXPORT_ISA_ENV}={name}" for name in [*runs, "portable"])


def _lacks(isa: str, info: dict[str, str]) -> bool:
    have = set(info.get("flags", "").split())
    return not set(export_cpu_flags(isa)) <= have


__all__ = ["CpuLoader"]
