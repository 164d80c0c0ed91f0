"""Loading the ``cpu`` target's ahead-of-time artifacts, with no C compiler.

``cu.save`` asks :meth:`cuvil_backend_cpu.target.CpuTarget.export` for the program
and one shared object per kernel, built for a named ISA level
(:data:`cuvil_backend_cpu.toolchain.EXPORT_LEVELS`). ``cu.load`` makes a
:class:`CpuLoader` (``BackendSpec.loader``), which checks that this host can run
those binaries (the machine, the ISA's CPU flags, the shared libraries they link)
before anything is loaded, then loads each verified binary from a folder only this
process uses (:func:`cuvil_backend_cpu.kernel_cache.load_library`).
"""

from __future__ import annotations

import ctypes.util
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil_backend_cpu.codegen import CKernel
from cuvil_backend_cpu.kernel_cache import load_library
from cuvil_backend_cpu.target import CpuHooks, launch
from cuvil_backend_cpu.toolchain import cpuinfo
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
        if want != machine:
            return f"its kernels are built for {want or 'an unknown machine'}, and this machine is {machine}"
        have = set(cpuinfo().get("flags", "").split())
        missing = [f for f in requires.get("cpu_flags", ()) if f not in have]
        if missing:
            return (
                f"its kernels are built for {requires.get('isa')}, and this CPU lacks {' '.join(missing)} "
                "(they would die with an illegal instruction); save the artifact again with "
                "CUVIL_CPU_ISA=avx2 or CUVIL_CPU_ISA=portable for older CPUs"
            )
        absent = [lib for lib in requires.get("libraries", ()) if ctypes.util.find_library(str(lib)) is None]
        if absent:
            return f"its kernels need the shared libraries {', '.join('lib' + a for a in absent)}, not found here"
        return None

    def load(self, graph: Graph, exported: Exported) -> ProgramExecutable:
        return load_program(self, graph, exported)

    def launches(self, kernels: Sequence[tuple[str, CKernel, bytes]]) -> list[Launch]:
        if self._folder is None:
            self._folder = trust.private_dir("aot")
        return [
            launch(load_library(blob, self._folder, name, f"kernel {name!r} of the artifact"), ck)
            for name, ck, blob in kernels
        ]


__all__ = ["CpuLoader"]
