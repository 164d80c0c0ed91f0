"""The ``cpu`` target's AArch64 ISA levels, as data: how each is built, what a CPU needs to
run it, its vector width, and the cache sizes its loop tiles are chosen for.

The levels nest (each runs only where the one before it runs):

========== ===================================== ======================================
level      ``-march`` (SVE: and one ``--param``)   what it adds, and hosts that have it
========== ===================================== ======================================
armv8-a    ``armv8-a``                           Advanced SIMD (NEON), 128-bit: every AArch64
                                                 Linux CPU (Cortex-A53/A72, Graviton1)
armv8.2-a  ``armv8.2-a+fp16+dotprod``            LSE atomics, half-precision arithmetic, int8
                                                 dot products (Neoverse N1: Graviton2, Altra)
sve        ``armv8.2-a+fp16+dotprod+sve``        SVE, vector-length-agnostic loops (Neoverse
                                                 V1: Graviton3, 256-bit vectors)
sve2       ``armv8.2-a+fp16+dotprod+sve2``       SVE2 (Neoverse N2/V2: Graviton4, Cobalt 100)
========== ===================================== ======================================

SVE code is built vector-length agnostic (GCC's default ``-msve-vector-bits=scalable``):
one binary runs at every vector length the hardware has, so a level never names a width.
Its :attr:`Level.vector_bytes` is the architectural minimum, 16, unless the host says more
(:func:`host_vector_bytes`).

A leaf module: :mod:`cuvil_backend_cpu.toolchain` turns these into compiler flags and
error messages, :mod:`cuvil_backend_cpu.emulation` runs the kernels under ``qemu-aarch64``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: ``platform.machine()`` of an AArch64 host (lower-cased; macOS says arm64)
MACHINES = ("aarch64", "arm64")
#: the machine name artifacts record for AArch64 kernels
MACHINE = "aarch64"
#: the cross compiler's usual name (Debian/Ubuntu: ``apt-get install gcc-aarch64-linux-gnu``)
CROSS_CC = "aarch64-linux-gnu-gcc"
#: the user-mode emulator (Debian/Ubuntu: ``apt-get install qemu-user``)
QEMU = ("qemu-aarch64", "qemu-aarch64-static")
#: the packages that provide both, as apt names them
APT_PACKAGES = ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes, and the line size."""

    l1d: int
    l2: int
    line: int = 64


@dataclass(frozen=True)
class Level:
    name: str
    #: the compiler flags that select it: ``-march``, and for SVE the workaround of
    #: [Note: SVE and GCC 12's omp simd reductions]
    flags: tuple[str, ...]
    #: the /proc/cpuinfo ``Features`` a CPU needs to run code built for this level: the
    #: optional extensions of ``march`` and the ones GCC may emit from plain C (LSE atomics in
    #: OpenMP reductions, rounding doubling multiply-adds in vector code)
    features: tuple[str, ...]
    #: bytes per vector register the compiler vectorizes for (SVE: the minimum, see the module doc)
    vector_bytes: int
    #: SVE: loops are vector-length agnostic
    scalable: bool
    #: caches of a typical CPU of the level, used where the host's cannot be read (or when
    #: building for another machine, so generated code never depends on the build host)
    caches: Caches
    #: the qemu-aarch64 CPU that emulation runs this level on: one without the next level's
    #: features where qemu has such a model, so an instruction beyond the level dies (SIGILL)
    #: instead of passing; SVE levels at a stated vector length
    qemu_cpu: str


# [Note: SVE and GCC 12's omp simd reductions]
# Found under emulation: GCC 12 miscompiles `#pragma omp simd reduction(+:acc)` for SVE when the
# loop is *not* vectorized (it calls a scalar expf: no libmvec variant). The per-lane partial
# result goes through an "omp simd array" of one element, which GCC then sums with an SVE masked
# load whose address it writes as (array - 16 - 16*VL) + (16 + 16*VL); the RTL scheduler takes
# that load and the store of the partial sum as disjoint and puts the load first. A softmax then
# divides by a stale or zero sum (inf, or the previous row's sum): 14 of the corpus's and row
# kernels' tests failed at both vector lengths tried. With --param=vect-partial-vector-usage=0 the
# vectorizer uses no masked loads (full vectors, then a scalar tail, as on x86), so that load does
# not exist; loops stay vector-length agnostic. Revisit with a newer GCC on a real SVE host.
_SVE_WORKAROUND = ("--param=vect-partial-vector-usage=0",)

_V8 = ("fp", "asimd")
_V82 = (*_V8, "atomics", "asimdrdm", "fphp", "asimdhp", "asimddp")

LEVELS: dict[str, Level] = {
    "armv8-a": Level(
        "armv8-a", ("-march=armv8-a",), _V8, 16, False, Caches(32 << 10, 512 << 10), "cortex-a72"
    ),
    "armv8.2-a": Level(
        "armv8.2-a",
        ("-march=armv8.2-a+fp16+dotprod",),
        _V82,
        16,
        False,
        Caches(64 << 10, 1 << 20),
        "neoverse-n1",
    ),
    # qemu has no CPU model with SVE but without SVE2: sve runs on `max` at 256 bits (Neoverse
    # V1's width), sve2 at 128 (Neoverse N2's): two vector lengths for one agnostic code path
    "sve": Level(
        "sve",
        ("-march=armv8.2-a+fp16+dotprod+sve", *_SVE_WORKAROUND),
        (*_V82, "sve"),
        16,
        True,
        Caches(64 << 10, 1 << 20),
        "max,sve-default-vector-length=32",
    ),
    "sve2": Level(
        "sve2",
        ("-march=armv8.2-a+fp16+dotprod+sve2", *_SVE_WORKAROUND),
        (*_V82, "sve", "sve2"),
        16,
        True,
        Caches(64 << 10, 1 << 20),
        "max,sve-default-vector-length=16",
    ),
}


def is_aarch64(machine: str) -> bool:
    return machine.lower() in MACHINES


def features(info: dict[str, str]) -> set[str]:
    """The CPU's features from /proc/cpuinfo (``Features`` on AArch64)."""
    return set(info.get("Features", "").split())


def missing(level: str, info: dict[str, str]) -> list[str]:
    """The features ``level`` needs that this CPU (its /proc/cpuinfo ``info``) does not list."""
    have = features(info)
    return [f for f in LEVELS[level].features if f not in have]


def best_level(info: dict[str, str]) -> str:
    """The highest level this CPU runs. ``armv8-a`` when /proc/cpuinfo lists no features:
    Advanced SIMD is mandatory for AArch64 Linux."""
    runs = [name for name in LEVELS if not missing(name, info)]
    return runs[-1] if runs else "armv8-a"


def levels_below(level: str) -> list[str]:
    names = list(LEVELS)
    return names[: names.index(level)]


# -- caches and tiles ----------------------------------------------------------------------------------

_SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _size(text: str) -> int | None:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


def host_caches(default: Caches, root: Path = _SYS_CACHE) -> Caches:
    """This host's L1 data and L2 sizes and line size from sysfs; ``default``'s where sysfs has
    none (many virtual machines publish no cache folders)."""
    l1d, l2, line = default.l1d, default.l2, default.line
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return default
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = _size((entry / "size").read_text())
            line_text = (entry / "coherency_line_size").read_text().strip()
        except OSError:
            continue
        if size is None:
            continue
        if level == "1" and kind == "Data":
            l1d = size
            line = int(line_text) if line_text.isdigit() else line
        elif level == "2" and kind in ("Unified", "Data"):
            l2 = size
    return Caches(l1d, l2, line)


def tile_size(caches: Caches) -> int:
    """The block of the tiling pass for transposing accesses (``SchedulePolicy.tile_size``):
    the largest power of two ``t`` whose two ``t x t`` tiles (the one read across, the one
    written along) of float64 fill at most half of L1, so the other operands and the stack
    keep the rest; at least one line of float32 per tile row, at most 64.

    32 KiB and 64 KiB L1s give 32 (the block measured on x86 hosts), a 128 KiB L1 (Apple's
    cores) 64."""
    t = max(8, caches.line // 4)
    while t < 64 and 2 * (2 * t) ** 2 * 8 <= caches.l1d // 2:
        t *= 2
    return t


def host_vector_bytes(level: Level, root: Path = Path("/proc/sys/abi/sve_default_vector_length")) -> int:
    """The vector width of ``level`` on this host: the kernel's default SVE vector length
    for SVE levels (where the host publishes it), else the level's."""
    if not level.scalable:
        return level.vector_bytes
    try:
        value = int(root.read_text().strip())
    except (OSError, ValueError):
        return level.vector_bytes
    return value if value >= 16 and value % 16 == 0 else level.vector_bytes


# -- building and running on another machine -------------------------------------------------------------


def cross_compiler() -> str | None:
    """The AArch64 cross compiler: ``$CUVIL_CPU_CROSS_CC`` when set (``None`` if it is no
    program), else ``aarch64-linux-gnu-gcc`` on PATH."""
    explicit = os.environ.get("CUVIL_CPU_CROSS_CC", "").strip()
    found = shutil.which(explicit or CROSS_CC)
    return os.path.abspath(found) if found else None


def qemu() -> str | None:
    for name in QEMU:
        found = shutil.which(name)
        if found:
            return os.path.abspath(found)
    return None


def sysroot(cc: str) -> str | None:
    """The folder holding the target's ``lib/ld-linux-aarch64.so.1`` (qemu's ``-L``), as the cross
    compiler knows it (Debian: /usr/aarch64-linux-gnu)."""
    try:
        proc = subprocess.run(
            [cc, "-print-file-name=ld-linux-aarch64.so.1"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(proc.stdout.strip())
    if proc.returncode == 0 and path.is_absolute() and path.exists():
        return str(path.resolve().parent.parent)
    fallback = Path("/usr/aarch64-linux-gnu")
    return str(fallback) if (fallback / "lib").is_dir() else None


def emulator_command(level: str, cc: str) -> tuple[str, ...] | None:
    """The command prefix that runs a program built by ``cc`` for ``level`` under qemu-aarch64
    (its CPU model, the target's libraries), or ``None`` when qemu or the libraries are missing."""
    q, root = qemu(), sysroot(cc)
    if q is None or root is None:
        return None
    return (q, "-cpu", LEVELS[level].qemu_cpu, "-L", root)


__all__ = [
    "APT_PACKAGES",
    "CROSS_CC",
    "Caches",
    "LEVELS",
    "Level",
    "MACHINE",
    "best_level",
    "cross_compiler",
    "emulator_command",
    "features",
    "host_caches",
    "host_vector_bytes",
    "is_aarch64",
    "levels_below",
    "missing",
    "qemu",
    "sysroot",
    "tile_size",
]
