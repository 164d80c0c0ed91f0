"""Find and probe the system C compiler that builds the CPU backend's kernels.

Kernels are C files that the machine's own compiler turns into shared objects,
so everything the generated code may rely on is decided here, once per process:

* which compiler (``$CC`` if set, else ``cc``, ``gcc``, ``clang`` on ``PATH``);
* the flags. ``-O3`` and the ISA's ``-march`` for speed, ``-fopenmp`` for ``#pragma omp``
  threads and ``omp simd`` loops, ``-fno-math-errno -fno-trapping-math`` so
  calls to ``expf`` & co. vectorise. Never ``-ffast-math``: it lets the compiler
  assume no inf/nan, and masked attention needs ``-inf`` to survive max and exp;
* whether glibc's libmvec works (``simd_math``): with it, a loop calling a math
  function declared ``__attribute__((simd("notinbranch")))`` calls the vector
  variant (``_ZGVeN16v_expf`` ...) instead of one scalar call per lane. That
  needs a libmvec new enough to have every function in
  :data:`SIMD_MATH_FUNCTIONS` (glibc 2.35), which only a real compile, link
  and call can tell;
* whether kernels may hold float16 and bfloat16 (``half``): the conversions
  (:data:`cuvil_backend_cpu.half.HELPERS`, plain integer and float arithmetic)
  are built with the kernels' flags and checked against torch's bits; where they
  disagree (a compiler that miscompiles them) half-precision ops stay torch's;
* the ISA and vector width (the ISA and its flags are part of every kernel's
  cache key). By default the host's own (``-march=native``); ``$CUVIL_CPU_ISA``
  forces one of :data:`ISA_CHOICES` (``avx2`` or ``portable`` on an AVX-512
  host, to test those code paths anywhere; the AArch64 levels of
  :mod:`cuvil_backend_cpu.aarch64`). An ISA this CPU cannot execute is a
  :class:`ToolchainError` naming the missing features, never a kernel that dies
  with SIGILL. An AArch64 level on another machine is built by the cross compiler:
  for an artifact (``$CUVIL_CPU_EXPORT_ISA``), or to run under qemu-aarch64
  (``$CUVIL_CPU_EMULATE=qemu``, :mod:`cuvil_backend_cpu.emulation`).

The probe costs one compile (about 0.05-0.15 s). Its result is kept in a small
JSON file under the kernel cache root, keyed by everything it depends on
(compiler path, version and mtime, CPU, this package's version), so later
processes only run ``cc --version``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from cuvil_backend_cpu import __version__, aarch64, half
from cuvil_runtime import trust
from cuvil_runtime.cache import default_cache_dir
from cuvil_runtime.registry import TargetConfigError

#: Flags every kernel is compiled with, plus the ISA's :func:`isa_flags` after ``-O3`` (see the
#: module docstring for why these and never -ffast-math).
BASE_FLAGS: tuple[str, ...] = (
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-shared",
    "-fPIC",
    "-std=c11",
)

#: Math functions with a libmvec vector variant that kernels may declare ``simd`` when ``simd_math`` holds.
SIMD_MATH_FUNCTIONS: tuple[str, ...] = ("expf", "logf", "erff", "tanhf", "expm1f", "log1pf")

#: C declarations a kernel pastes in (instead of ``<math.h>``'s) to get the vector variants.
SIMD_MATH_DECLARATIONS: str = "".join(
    f'__attribute__((simd("notinbranch"))) float {name}(float);\n' for name in SIMD_MATH_FUNCTIONS
)

_VECTOR_BYTES = {
    "avx512": 64,
    "avx2": 32,
    "generic": 16,
    "portable": 16,
    **{name: level.vector_bytes for name, level in aarch64.LEVELS.items()},
}
_CANDIDATES = ("cc", "gcc", "clang")

#: The environment variable that forces the ISA kernels are built for.
ISA_ENV = "CUVIL_CPU_ISA"
#: Its values: ``native`` (the default: the host's own ISA, ``-march=native``), ``avx512``
#: (x86-64 with AVX-512F: ``-march=native``), ``avx2`` (``-march=x86-64-v3``: AVX2 + FMA,
#: what an AMD Zen 3 has), ``portable`` (the architecture's baseline: SSE2 on x86-64,
#: ``-march=armv8-a`` on AArch64, the compiler's default elsewhere) and the AArch64 levels
#: of :data:`cuvil_backend_cpu.aarch64.LEVELS` (``armv8-a``, ``armv8.2-a``, ``sve``, ``sve2``).
ISA_CHOICES: tuple[str, ...] = ("native", "avx512", "avx2", "portable", *aarch64.LEVELS)
#: ``qemu``: lets ``$CUVIL_CPU_ISA`` name an AArch64 level on a machine that is not AArch64;
#: kernels are then built by the cross compiler and run under qemu-aarch64 (tests: slow).
EMULATE_ENV = "CUVIL_CPU_EMULATE"
#: AVX-512 kernels are built for 512-bit vectors, as the Loop IR plans them (``_VECTOR_BYTES``):
#: gcc's tuning for several AVX-512 CPUs vectorizes at 256 bits unless told (docs/cpu-backend.md).
_WIDE = ("-mprefer-vector-width=512",)

#: The ISA level ``cu.save`` builds kernels for, when it differs from ``$CUVIL_CPU_ISA``'s: an
#: AArch64 level on an x86-64 host is built by the cross compiler (nothing runs).
EXPORT_ISA_ENV = "CUVIL_CPU_EXPORT_ISA"
#: /proc/cpuinfo flags a forced ISA needs (x86-64-v3 is AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE).
_ISA_CPU_FLAGS = {
    "avx512": ("avx512f", "avx2", "fma"),
    "avx2": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
}
_X86 = ("x86_64", "amd64")
#: How kernels of an ahead-of-time artifact (``cu.save``) are built: for a named ISA level,
#: never ``-march=native``, whose code may use features of this exact CPU only. Each level's
#: ``-march`` and the /proc/cpuinfo flags a host needs to run it (x86-64-v4: AVX-512 F, BW,
#: CD, DQ and VL on top of v3).
EXPORT_LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512": (
        ("-march=x86-64-v4", *_WIDE),
        (*_ISA_CPU_FLAGS["avx2"], "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    ),
    "avx2": (("-march=x86-64-v3",), _ISA_CPU_FLAGS["avx2"]),
}


class ToolchainError(RuntimeError):
    """No usable C compiler; the message says what is missing and how to fix it."""


class IsaError(ToolchainError, TargetConfigError):
    """``$CUVIL_CPU_ISA`` is not a known value, or names an ISA this CPU cannot run. An
    explicit setting, so the ``cpu`` target is unavailable and no other target (``reference``)
    is picked in its place (:class:`cuvil_runtime.registry.TargetConfigError`)."""


@dataclass(frozen=True)
class Toolchain:
    """A probed compiler and the flags kernels are built with."""

    cc: str  #: absolute path of the compiler
    version: str  #: first line of ``cc --version``
    isa: str  #: "avx512" | "avx2" | "generic" | an AArch64 level (the host's own) | "portable"
    flags: tuple[str, ...]  #: :data:`BASE_FLAGS` with the ISA's ``-march`` after ``-O3``
    libs: tuple[str, ...]  #: linker inputs, after the source on the command line
    simd_math: bool  #: libmvec vector math usable (see :data:`SIMD_MATH_DECLARATIONS`)
    vector_bytes: int  #: 64 for avx512, 32 for avx2, 16 for generic/portable/AArch64 (SVE: see aarch64)
    #: kernels may hold float16/bfloat16: the half conversions built with these flags give torch's bits
    #: (probed on this machine; AArch64 levels built here for another machine are not probed: False)
    half: bool = True
    #: The CPU model: ``-march=native`` code may not run on another CPU with the same ``isa``, so
    #: a cache folder shared between machines (an NFS home) must not hand one machine's kernels to another.
    cpu: str = ""
    #: What ``$CUVIL_CPU_ISA`` asked for (one of :data:`ISA_CHOICES`); ``isa`` and ``flags`` say what it
    #: resolved to (``native`` and ``avx512`` on an AVX-512 host build the same bytes, so share kernels).
    requested: str = field(default="native", compare=False)
    #: the tiling pass's block (``SchedulePolicy.tile_size``) for this level's caches (AArch64:
    #: :func:`cuvil_backend_cpu.aarch64.tile_size`; 32, as measured, on x86-64)
    tile_size: int = 32
    #: the command prefix that runs programs built here when this machine cannot run them itself
    #: (``qemu-aarch64 -cpu ... -L ...`` under ``$CUVIL_CPU_EMULATE``); empty: kernels load in-process
    emulator: tuple[str, ...] = ()

    @property
    def identity(self) -> str:
        """Everything that changes the compiled bytes, as a stable string (part of every cache key)."""
        parts = [self.cc, self.version, self.isa, self.cpu, " ".join(self.flags), " ".join(self.libs)]
        if not self.half:
            parts.append("no half")
        if self.tile_size != 32:  # (x86-64 identities stay what they were)
            parts.append(f"tile {self.tile_size}")
        if self.emulator:
            parts.append(" ".join(self.emulator))
        return "\n".join(parts)

    @property
    def machine(self) -> str:
        """The machine the kernels are for: this one's, or ``aarch64`` for an AArch64 level."""
        return aarch64.MACHINE if self.isa in aarch64.LEVELS else platform.machine().lower()

    def command(self, source: str | os.PathLike[str], output: str | os.PathLike[str]) -> list[str]:
        """The command line that compiles ``source`` into the shared object ``output``."""
        return [self.cc, *self.flags, "-o", os.fspath(output), os.fspath(source), *self.libs]


def default_kernel_cache_dir() -> Path:
    """``<cuvil cache>/cpu-kernels``: compiled kernels and the probe record (honours ``$CUVIL_CACHE_DIR``)."""
    return default_cache_dir() / "cpu-kernels"


# -- finding the compiler ----------------------------------------------------------------------------------


def _install_hint() -> str:
    if sys.platform == "darwin":
        return (
            "install the command line tools (xcode-select --install) and libomp, or set CC=/path/to/compiler"
        )
    return "install gcc (apt install gcc) or set CC=/path/to/compiler"


def _find_compiler() -> str:
    """The compiler's absolute path. An explicit ``$CC`` is used or rejected, never silently replaced."""
    explicit = os.environ.get("CC", "").strip()
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise ToolchainError(
                f"no C compiler found: CC={explicit!r} is not an executable (nor a program on PATH); "
                f"set CC=/path/to/compiler, or unset CC to search {', '.join(_CANDIDATES)} on PATH"
            )
        return os.path.abspath(found)
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return os.path.abspath(found)
    raise ToolchainError(
        f"no C compiler found: looked for $CC, {', '.join(_CANDIDATES)} on PATH; {_install_hint()}"
    )


def _compiler_version(cc: str) -> str:
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run the C compiler {cc} --version: {e}; {_install_hint()}") from e
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ToolchainError(
            f"the C compiler {cc} --version failed (exit status {proc.returncode}): "
            f"{proc.stderr.strip()[:500]}; {_install_hint()}"
        )
    return lines[0].strip()


# -- the CPU -----------------------------------------------------------------------------------------------


def cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # one processor is enough; the others repeat it
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _detect_isa(info: dict[str, str]) -> str:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        flags = set(info.get("flags", "").split())
        if "avx512f" in flags:
            return "avx512"
        if {"avx2", "fma"} <= flags:
            return "avx2"
        return "generic"
    if aarch64.is_aarch64(machine):
        return aarch64.best_level(info)
    return "generic"


def requested_isa(env: str = ISA_ENV) -> str:
    """``$CUVIL_CPU_ISA`` (or ``env``), lower-cased (``native`` when unset or empty); :class:`IsaError` if unknown."""
    raw = os.environ.get(env, "").strip()
    value = raw.lower() or "native"
    if value not in ISA_CHOICES:
        raise IsaError(f"{env}={raw!r} is not one of {', '.join(ISA_CHOICES)} (unset it for native)")
    return value


def isa_flags(requested: str, info: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The ISA ``requested`` resolves to on this CPU, and its ``-march`` flags.

    Raises :class:`ToolchainError` when this CPU cannot execute code built for it:
    the kernel would otherwise die with SIGILL (an illegal instruction) on its first call.
    """
    machine = platform.machine().lower()
    if requested == "native":
        isa = _detect_isa(info)
        return isa, (("-march=native", *_WIDE) if isa == "avx512" else ("-march=native",))
    if requested == "portable":
        if machine in _X86:
            return "portable", ("-march=x86-64", "-mtune=generic")
        if aarch64.is_aarch64(machine):
            return "portable", ("-march=armv8-a",)
        return "portable", ()
    if requested in aarch64.LEVELS:
        return requested, _aarch64_flags(requested, info, machine)
    model = info.get("model name") or platform.processor() or machine
    if machine not in _X86:
        raise IsaError(
            f"{ISA_ENV}={requested} needs an x86-64 CPU; this machine is {machine or 'unknown'} "
            f"(use {ISA_ENV}=portable, or unset it for the native ISA)"
        )
    have = set(info.get("flags", "").split())
    missing = [f for f in _ISA_CPU_FLAGS[requested] if f not in have]
    if missing:
        where = "/proc/cpuinfo lists no CPU flags here" if not have else f"this CPU ({model}) lacks"
        raise IsaError(
            f"{ISA_ENV}={requested}: {where} {' '.join(missing)}, so kernels built for {requested} "
            f"would die with an illegal instruction; use "
            f"{' or '.join(f'{ISA_ENV}={c}' for c in ('avx2', 'portable') if c != requested)}, "
            f"or unset it for the native ISA"
        )
    if requested == "avx512":
        return "avx512", ("-march=native", *_WIDE)  # the host has AVX-512: its full feature set
    return "avx2", ("-march=x86-64-v3",)


def _cpu_model(info: dict[str, str]) -> str:
    """The model name plus a digest of the feature flags: "AMD EPYC" alone names CPUs with and without
    AVX-512, and ``-march=native`` code follows the flags."""
    model = info.get("model name") or info.get("cpu model") or platform.processor() or platform.machine()
    features = "|".join(info.get(k, "") for k in ("flags", "Features", "CPU implementer", "CPU part"))
    return f"{model} [{hashlib.sha256(features.encode()).hexdigest()[:12]}]"


# -- probing libmvec ---------------------------------------------------------------------------------------

_PROBE_SOURCE = (
    "#include <omp.h>\n"
    "#ifdef CUVIL_PROBE_SIMD\n"
    '#define CUVIL_SIMD __attribute__((simd("notinbranch")))\n'
    "#else\n"
    "#define CUVIL_SIMD\n"
    "#endif\n"
    + "".join(f"CUVIL_SIMD float {name}(float);\n" for name in SIMD_MATH_FUNCTIONS)
    + "int cuvil_probe(const float *x, float *y, int n) {\n"
    "#pragma omp simd\n"
    "  for (int i = 0; i < n; ++i)\n"
    "    y[i] = expf(x[i]) + logf(x[i] + 2.0f) + erff(x[i]) + tanhf(x[i])\n"
    "         + expm1f(x[i]) + log1pf(x[i] + 1.0f);\n"
    "  return omp_get_max_threads();\n"
    "}\n"
)


def _probe_expected(x: float) -> float:
    return math.exp(x) + math.log(x + 2) + math.erf(x) + math.tanh(x) + math.expm1(x) + math.log1p(x + 1)


def _try_probe(cc: str, workdir: Path, flags: tuple[str, ...], *, simd: bool) -> str | None:
    """Compile, link, load and call the probe; ``None`` when it all worked, else what went wrong.

    Loading matters: a shared object links even with undefined symbols, so an old
    libmvec lacking ``_ZGVeN16v_erff`` only shows when the object is loaded.
    The probe runs no parallel region, so no OpenMP thread pool starts in this
    process (a pool would misbehave in children of a later ``fork``).
    """
    source = workdir / "probe.c"
    source.write_text(_PROBE_SOURCE)
    output = workdir / f"probe-{'simd' if simd else 'plain'}.so"
    extra = ["-DCUVIL_PROBE_SIMD", "-Werror"] if simd else []  # -Werror: clang ignores `simd` with a warning
    libs = ["-lmvec", "-lm"] if simd else ["-lm"]
    cmd = [cc, *flags, *extra, "-o", str(output), str(source), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(cmd)}: {e}"
    if proc.returncode != 0:
        return f"{' '.join(cmd)} failed:\n" + "\n".join(proc.stderr.strip().splitlines()[:20])
    try:
        lib = ctypes.CDLL(str(output))
        fn = lib.cuvil_probe
        fn.restype = ctypes.c_int
        n = 37  # a full 512-bit vector or two plus a remainder
        xs = [0.05 * i - 0.9 for i in range(n)]
        x = (ctypes.c_float * n)(*xs)
        y = (ctypes.c_float * n)()
        threads = fn(x, y, ctypes.c_int(n))
    except (OSError, AttributeError) as e:
        return f"loading the probe built by {' '.join(cmd)} failed: {e}"
    if threads < 1:
        return f"omp_get_max_threads() returned {threads}"
    for xi, yi in zip(xs, y):
        want = _probe_expected(xi)
        if not math.isclose(yi, want, rel_tol=1e-4, abs_tol=1e-5):
            return f"the probe computed {yi} for x={xi}, expected {want}"
    return None


def _probe(cc: str, flags: tuple[str, ...], requested: str) -> bool:
    """Whether libmvec works with ``cc`` and ``flags``; raises :class:`ToolchainError` when even plain
    kernels cannot build. The probe is built with the kernels' own flags, so a forced ISA's
    libmvec variants (``_ZGVdN8v_expf`` for avx2, ``_ZGVbN4v_expf`` for portable) are what is tried."""
    with tempfile.TemporaryDirectory(prefix="cuvil-cc-probe-") as tmp:
        if _try_probe(cc, Path(tmp), flags, simd=True) is None:
            return True
        reason = _try_probe(cc, Path(tmp), flags, simd=False)
    if reason is not None:
        forced = (
            f" (with the flags of {ISA_ENV}={requested}: an older compiler may not know them)"
            if requested != "native"
            else ""
        )
        raise ToolchainError(
            f"the C compiler {cc} cannot build OpenMP shared libraries{forced}: {reason}\n"
            f"the CPU backend needs a C compiler with OpenMP support (gcc has it built in; clang needs libomp); "
            f"{_install_hint()}"
        )
    return False


def _probe_half(cc: str, flags: tuple[str, ...]) -> bool:
    """Whether the half-precision conversions built with ``flags`` give torch's bits
    (:func:`cuvil_backend_cpu.half.probe`); a failure keeps half types out of kernels,
    with a warning saying why."""
    with tempfile.TemporaryDirectory(prefix="cuvil-cc-probe-") as tmp:
        reason = half.probe(cc, flags, tmp)
    if reason is not None:
        warnings.warn(
            f"float16/bfloat16 ops run as torch calls on the cpu target: {reason}",
            RuntimeWarning,
            stacklevel=3,
        )
    return reason is None


# -- the on-disk probe record ------------------------------------------------------------------------------


def _record_path(cc: str, version: str, isa: str, cpu: str, flags: tuple[str, ...]) -> Path:
    try:
        mtime = os.stat(
            cc
        ).st_mtime_ns  # follows symlinks: upgrading the compiler behind /usr/bin/cc changes it
    except OSError:
        mtime = 0
    key = "\n".join([__version__, cc, os.path.realpath(cc), str(mtime), version, isa, cpu, " ".join(flags)])
    # the kernel cache's folder as the kernel cache sees it: a folder others can write is
    # replaced by a private one (docs/security.md), so a record is never read from there
    folder = trust.trusted_dir(default_kernel_cache_dir(), "kernel cache")
    return folder / f"toolchain-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _read_record(path: Path) -> tuple[bool, bool] | None:
    """The recorded ``(simd_math, half)``, or ``None`` when there is no readable record."""
    data = trust.read_private_file(path)  # ours, not writable by others, not a link
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    simd_math, half_ok = record.get("simd_math"), record.get("half")
    if isinstance(simd_math, bool) and isinstance(half_ok, bool):
        return simd_math, half_ok
    return None


def _write_record(path: Path, record: dict[str, object]) -> None:
    """Write atomically (temp file + ``os.replace``); a read-only cache only costs a re-probe next time."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        trust.make_dirs(path.parent)
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


# -- public entry points -----------------------------------------------------------------------------------

_lock = threading.Lock()
_toolchain: Toolchain | None = None


def export_isa(requested: str, info: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The named ISA level an ahead-of-time artifact is built for, and its ``-march``:
    ``requested`` (``$CUVIL_CPU_ISA``) when it names one, else the best level this
    CPU runs (see :data:`EXPORT_LEVELS`); ``portable`` everywhere else."""
    if requested in aarch64.LEVELS and not aarch64.is_aarch64(platform.machine()):
        return requested, aarch64.LEVELS[requested].flags  # the cross compiler's: nothing runs here
    isa, _ = isa_flags(requested, info)  # a level this CPU cannot run is refused here
    if isa in aarch64.LEVELS:  # (an AArch64 host's own level too)
        return isa, aarch64.LEVELS[isa].flags
    if isa == "avx512":
        have = set(info.get("flags", "").split())
        isa = "avx512" if set(EXPORT_LEVELS["avx512"][1]) <= have else "avx2"
    if isa in EXPORT_LEVELS:
        return isa, EXPORT_LEVELS[isa][0]
    return isa_flags("portable", info)


def export_cpu_flags(isa: str) -> tuple[str, ...]:
    """The /proc/cpuinfo flags (AArch64: ``Features``) a host needs to run kernels exported for ``isa``."""
    if isa in aarch64.LEVELS:
        return aarch64.LEVELS[isa].features
    return EXPORT_LEVELS[isa][1] if isa in EXPORT_LEVELS else ()


def _detect(requested: str, use_record: bool, export: bool = False) -> Toolchain:
    info = cpuinfo()
    if _builds_elsewhere(requested, export):
        return _detect_cross(requested, use_record, export)
    # the ISA before the compiler: a wrong ISA is the clearer error
    isa, march = export_isa(requested, info) if export else isa_flags(requested, info)
    flags = (BASE_FLAGS[0], *march, *BASE_FLAGS[1:])  # -O3 -march=... -fopenmp ...
    cc = _find_compiler()
    version = _compiler_version(cc)
    # exported kernels run on any CPU of their level: not keyed by this one
    cpu = f"any {platform.machine().lower()} with {isa}" if export else _cpu_model(info)
    record = _record_path(cc, version, isa, cpu, flags)
    found = _read_record(record) if use_record else None
    if found is not None:
        simd_math, half_ok = found
    else:
        simd_math = _probe(cc, flags, requested)
        half_ok = _probe_half(cc, flags)
        _write_record(
            record,
            {
                "cc": cc,
                "version": version,
                "isa": isa,
                "flags": list(flags),
                "cpu": cpu,
                "simd_math": simd_math,
                "half": half_ok,
            },
        )
    vector_bytes, tile_size = _host_tiles(isa, export)
    return Toolchain(
        cc=cc,
        version=version,
        isa=isa,
        flags=flags,
        libs=("-lmvec", "-lm") if simd_math else ("-lm",),
        simd_math=simd_math,
        vector_bytes=vector_bytes,
        cpu=cpu,
        requested=requested,
        tile_size=tile_size,
        half=half_ok,
    )


def find_toolchain(refresh: bool = False) -> Toolchain:
    """The compiler kernels are built with, found and probed once per process (and again
    when ``$CUVIL_CPU_ISA`` changed; a target already created keeps the toolchain it got).

    ``refresh=True`` looks again (after ``$CC`` or ``PATH`` changed) and re-runs
    the probe instead of trusting the on-disk record. Failures are not
    memoised: a later call looks again. Raises :class:`ToolchainError`.
    """
    global _toolchain
    with _lock:
        requested = requested_isa()
        if _toolchain is None or refresh or _toolchain.requested != requested:
            _toolchain = None
            _toolchain = _detect(requested, use_record=not refresh)
        return _toolchain


_exporters: dict[str, Toolchain] = {}


def export_toolchain() -> Toolchain:
    """The toolchain that builds ahead-of-time artifacts' kernels (:func:`export_isa`) for
    ``$CUVIL_CPU_EXPORT_ISA``, else ``$CUVIL_CPU_ISA``, found once per value. An AArch64 level
    on another machine is built by the cross compiler. Raises :class:`ToolchainError`."""
    with _lock:
        requested = requested_isa(EXPORT_ISA_ENV if os.environ.get(EXPORT_ISA_ENV, "").strip() else ISA_ENV)
        tc = _exporters.get(requested)
        if tc is None:
            tc = _exporters[requested] = _detect(requested, use_record=True, export=True)
        return tc


_emulators: dict[str, Toolchain] = {}


def emulation_toolchain(level: str) -> Toolchain | None:
    """The toolchain that runs kernels of AArch64 ``level`` under qemu here (an artifact's, for
    :mod:`cuvil_backend_cpu.aot`), when ``$CUVIL_CPU_EMULATE`` asks for emulation and this
    machine is not AArch64; ``None`` otherwise. Raises :class:`ToolchainError`."""
    if not _builds_elsewhere(level, export=False):
        return None
    with _lock:
        tc = _emulators.get(level)
        if tc is None:
            tc = _emulators[level] = _detect_cross(level, use_record=True, export=False)
        return tc


def check() -> str | None:
    """``None`` when kernels can be built here, else why not (for the backend's availability check).
    Raises :class:`IsaError` (a :class:`~cuvil_runtime.registry.TargetConfigError`) for a bad
    ``$CUVIL_CPU_ISA``: the user's explicit setting, not a missing piece to fall back around."""
    try:
        find_toolchain()
    except IsaError:
        raise
    except ToolchainError as e:
        return str(e)
    except Exception as e:  # an availability check must answer, not raise
        return f"probing the C compiler failed: {type(e).__name__}: {e}"
    return None


# -- AArch64 levels: on an AArch64 host, or built here for one (cross compiler, qemu) ------------------


def _aarch64_flags(level: str, info: dict[str, str], machine: str) -> tuple[str, ...]:
    """The ``-march`` of ``level`` when this CPU runs it, else :class:`IsaError` saying why and what to do."""
    if not aarch64.is_aarch64(machine):
        raise IsaError(
            f"{ISA_ENV}={level} builds AArch64 kernels, and this machine is {machine or 'unknown'}: they "
            f"cannot run here. To write an artifact for an AArch64 host, set {EXPORT_ISA_ENV}={level} "
            f"for cu.save (needs {aarch64.CROSS_CC}); to run them here under emulation (tests, slow), "
            f"also set {EMULATE_ENV}=qemu (needs qemu-aarch64: "
            f"apt-get install {' '.join(aarch64.APT_PACKAGES)}); or unset {ISA_ENV} for the native ISA"
        )
    lacking = aarch64.missing(level, info)
    if lacking:
        lower = [f"{ISA_ENV}={n}" for n in aarch64.levels_below(level) if not aarch64.missing(n, info)]
        raise IsaError(
            f"{ISA_ENV}={level}: this CPU ({_cpu_name(info)}) lacks {' '.join(lacking)} in /proc/cpuinfo "
            f"Features, so kernels built for {level} would die with an illegal instruction; use "
            f"{' or '.join([*lower, f'{ISA_ENV}=portable'])}, or unset it for the native ISA"
        )
    return aarch64.LEVELS[level].flags


def _cpu_name(info: dict[str, str]) -> str:
    part = info.get("CPU part")
    return info.get("model name") or (f"CPU part {part}" if part else platform.machine())


def emulation_requested() -> bool:
    """``$CUVIL_CPU_EMULATE`` is ``qemu`` (``False`` when unset or empty; :class:`IsaError` otherwise)."""
    raw = os.environ.get(EMULATE_ENV, "").strip()
    if raw.lower() in ("", "qemu"):
        return bool(raw)
    raise IsaError(f"{EMULATE_ENV}={raw!r} is not qemu (unset it to run kernels natively)")


def _builds_elsewhere(requested: str, export: bool) -> bool:
    """Whether ``requested`` is an AArch64 level to build on this other machine: for an artifact
    (nothing runs), or to run under qemu (``$CUVIL_CPU_EMULATE``); otherwise :func:`isa_flags`
    refuses it, saying how to ask for either."""
    if requested not in aarch64.LEVELS or aarch64.is_aarch64(platform.machine()):
        return False
    return emulation_requested() or export


def _host_tiles(isa: str, export: bool) -> tuple[int, int]:
    """``vector_bytes`` and ``tile_size`` of ``isa``: an AArch64 host's own (its SVE vector length,
    its caches) for its kernels, the level's defaults for an artifact's (any CPU of the level);
    on x86-64 the ISA's width and the block measured there (32)."""
    level = aarch64.LEVELS.get(isa)
    if level is None:
        return _VECTOR_BYTES[isa], 32
    if export:
        return level.vector_bytes, aarch64.tile_size(level.caches)
    return aarch64.host_vector_bytes(level), aarch64.tile_size(aarch64.host_caches(level.caches))


def _detect_cross(level: str, use_record: bool, export: bool) -> Toolchain:
    """The toolchain of an AArch64 level on another machine: the cross compiler, and for kernels
    that run (not an artifact's) the qemu-aarch64 command that runs them. The caches are the
    level's defaults, never this host's, so the code generated is the same on every build host."""
    how = "for an artifact" if export else f"under {EMULATE_ENV}=qemu"
    apt = f"apt-get install {' '.join(aarch64.APT_PACKAGES)}"
    cc = aarch64.cross_compiler()
    if cc is None:
        raise IsaError(
            f"{level} kernels {how} need an AArch64 cross compiler: {aarch64.CROSS_CC} is not on PATH "
            f"({apt}), or set CUVIL_CPU_CROSS_CC=/path/to/aarch64-gcc"
        )
    emulator: tuple[str, ...] = ()
    if not export:
        emulator = aarch64.emulator_command(level, cc) or ()
        if not emulator:
            raise IsaError(
                f"{level} kernels {how} need qemu-aarch64 on PATH and the AArch64 C library "
                f"(/usr/aarch64-linux-gnu): {apt}"
            )
    spec = aarch64.LEVELS[level]
    flags = (BASE_FLAGS[0], *spec.flags, *BASE_FLAGS[1:])
    version = _compiler_version(cc)
    cpu = f"any {aarch64.MACHINE} with {level}" if export else f"{level} under qemu-aarch64"
    record = _record_path(cc, version, level, cpu, (*flags, *emulator))
    found = _read_record(record) if use_record else None
    simd_math = found[0] if found is not None else _probe_cross(cc, flags, level, emulator)
    if found is None:
        # half: the conversions' probe loads them into this process, which cannot run AArch64
        # code, so half-precision ops stay torch's in kernels built for another machine
        _write_record(record, {"cc": cc, "version": version, "isa": level, "flags": list(flags), "cpu": cpu,
                               "emulator": list(emulator), "simd_math": simd_math, "half": False})  # fmt: skip
    return Toolchain(
        cc=cc,
        version=version,
        isa=level,
        flags=flags,
        libs=("-lmvec", "-lm") if simd_math else ("-lm",),
        simd_math=simd_math,
        vector_bytes=spec.vector_bytes,
        cpu=cpu,
        requested=level,
        tile_size=aarch64.tile_size(spec.caches),
        emulator=emulator,
        half=False,
    )


#: the probe as a program: linking an executable (unlike a shared object) fails on a libmvec
#: variant the target's C library lacks, and under qemu it runs and prints what it computed
_PROBE_MAIN = r"""
#include <stdio.h>
int main(void) {
  float x[37], y[37];
  for (int i = 0; i < 37; ++i) x[i] = 0.05f * (float)i - 0.9f;
  printf("%d\n", cuvil_probe(x, y, 37));
  for (int i = 0; i < 37; ++i) printf("%a %a\n", (double)x[i], (double)y[i]);
  return 0;
}
"""


def _try_cross_probe(
    cc: str, workdir: Path, flags: tuple[str, ...], emulator: tuple[str, ...], *, simd: bool
) -> str | None:
    """Build the probe program (and run it under ``emulator`` when given); ``None`` when all worked."""
    source = workdir / "probe_main.c"
    source.write_text(_PROBE_SOURCE + _PROBE_MAIN)
    program = workdir / f"probe-{'simd' if simd else 'plain'}"
    extra = ["-DCUVIL_PROBE_SIMD", "-Werror"] if simd else []
    libs = ["-lmvec", "-lm"] if simd else ["-lm"]
    cmd = [cc, *(f for f in flags if f != "-shared"), *extra, "-o", str(program), str(source), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(cmd)}: {e}"
    if proc.returncode != 0:
        return f"{' '.join(cmd)} failed:\n" + "\n".join(proc.stderr.strip().splitlines()[:20])
    if not emulator:
        return None
    run = [*emulator, str(program)]
    try:
        proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(run)}: {e}"
    lines = proc.stdout.split("\n")
    if proc.returncode != 0 or len(lines) < 38:
        return f"{' '.join(run)} failed (exit status {proc.returncode}): {proc.stderr.strip()[:500]}"
    if int(lines[0]) < 1:
        return f"omp_get_max_threads() returned {lines[0]} under {' '.join(emulator)}"
    for line in lines[1:38]:
        xi, yi = (float.fromhex(v) for v in line.split())
        want = _probe_expected(xi)
        if not math.isclose(yi, want, rel_tol=1e-4, abs_tol=1e-5):
            return f"the probe computed {yi} for x={xi} under {' '.join(emulator)}, expected {want}"
    return None


def _probe_cross(cc: str, flags: tuple[str, ...], level: str, emulator: tuple[str, ...]) -> bool:
    """As :func:`_probe`, for a level built for another machine."""
    with tempfile.TemporaryDirectory(prefix="cuvil-cc-probe-") as tmp:
        if _try_cross_probe(cc, Path(tmp), flags, emulator, simd=True) is None:
            return True
        reason = _try_cross_probe(cc, Path(tmp), flags, emulator, simd=False)
    if reason is not None:
        raise IsaError(
            f"the AArch64 cross compiler {cc} cannot build OpenMP programs for {level}: {reason}"
            f" (a missing header is the cross C library: apt-get install {' '.join(aarch64.APT_PACKAGES)})"
        )
    return False


__all__ = [
    "BASE_FLAGS",
    "EMULATE_ENV",
    "EXPORT_ISA_ENV",
    "emulation_requested",
    "emulation_toolchain",
    "ISA_CHOICES",
    "ISA_ENV",
    "SIMD_MATH_DECLARATIONS",
    "SIMD_MATH_FUNCTIONS",
    "Toolchain",
    "ToolchainError",
    "EXPORT_LEVELS",
    "IsaError",
    "check",
    "default_kernel_cache_dir",
    "export_cpu_flags",
    "export_isa",
    "export_toolchain",
    "find_toolchain",
    "isa_flags",
    "requested_isa",
]
