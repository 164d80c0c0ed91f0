"""Sessions for the whole monorepo: the CI matrix, one place.

    nox -s tests              every package's fast tests, in one environment, then the
                              cpu corpus built for avx2 and portable (as tests_isa), then
                              tests_cuda, tests_ascend, tests_ascend_compile, tests_plugins
                              and tests_arm64
    nox -s tests_cuda         the cuda target in Triton's interpreter (and PTX for sm_90)
    nox -s tests_ascend       the ascend target simulated in Triton's interpreter
    nox -s tests_ascend_compile  every ascend kernel through triton-ascend's compiler front half
    nox -s tests_plugins      the example plugin distributions (examples/), installed and tested
    nox -s tests_pkg          each package alone, with only what it depends on
    nox -s tests_isa          the cpu target's corpus built for avx2 and portable ($CUVIL_CPU_ISA)
    nox -s tests_arm64        the cpu target's corpus built for each AArch64 level, run under qemu
    nox -s slow               the tests marked slow (the Ray Serve example's included; the
                              cuda and ascend targets' in the interpreter / simulation)
    nox -s serve_example      examples/serve on Ray Serve, on loopback
    nox -s serve_llm_ray      cuvil-serve's LLM server on Ray Serve with replicas, on loopback
    nox -s lint typecheck     ruff and the import-cycle check; mypy (strict on cuvil_ir)
    nox -s demo               examples/demo.py
    nox -s wheels             build wheels, install cuvil[cpu] into a fresh venv, smoke-test
    nox -s bench              eager vs torch.compile vs Cuvil (benchmarks/README.md)

The packages: cuvil-ir, cuvil-runtime, cuvil-core (``cuvil``), the targets
cuvil-backend-cpu, cuvil-backend-cuda and cuvil-backend-ascend, and cuvil-serve (the LLM
serving engine and its HTTP API; ``tests`` runs its tests beside the others). Its tests compile C, so ``tests``, ``tests_pkg(cpu)``,
``demo`` and ``wheels`` need a C compiler (gcc or clang) on PATH.

[Note: pinning torch]
Every environment that gets torch asks for exactly ``torch==2.13.0``: that is the
CPU wheel lying on this machine's disk. Any looser requirement (a bare ``torch``,
or ``torch>=2.6`` from our packages' metadata with no torch installed yet) lets
pip pick a multi-GB CUDA build. So torch is named first, pinned, in the same pip
command that installs our packages. torch's CPU wheel does not bring numpy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
TORCH = ["torch==2.13.0", "numpy"]  # see [Note: pinning torch]
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
GRIMP = "grimp==3.20"  # the import graph for tools/check_import_cycles.py
PYTEST = "pytest>=8"
HYPOTHESIS = "hypothesis"  # the differential fuzzer, packages/cuvil-core/tests/test_fuzz.py
#: builds the plugin distributions that packages/cuvil-core/tests/test_plugins.py installs
#: while a process runs (pip --no-build-isolation: no index needed at test time)
HATCHLING = "hatchling"
#: the model zoo (packages/cuvil-core/tests/test_model_zoo.py): real architectures from small
#: configs; a test dependency only, pinned so a new release cannot change CI under us
TRANSFORMERS = "transformers==5.24.0"
#: torchao's weight-only configs, which cu.quantize converts (tests/test_quantize.py); a test
#: dependency only, no requirements of its own (it uses the installed torch), pinned
TORCHAO = "torchao==0.18.0"

#: package id -> (folder, sibling folders it depends on, itself last)
PACKAGES = {
    "ir": ["packages/cuvil-ir"],
    "runtime": ["packages/cuvil-ir", "packages/cuvil-runtime"],
    "core": ["packages/cuvil-ir", "packages/cuvil-runtime", "packages/cuvil-core"],
    "cpu": [
        "packages/cuvil-ir",
        "packages/cuvil-runtime",
        "packages/cuvil-core",
        "packages/cuvil-backend-cpu",
    ],
    "cuda": [
        "packages/cuvil-ir",
        "packages/cuvil-runtime",
        "packages/cuvil-core",
        "packages/cuvil-backend-cuda",
    ],
    "ascend": [
        "packages/cuvil-ir",
        "packages/cuvil-runtime",
        "packages/cuvil-core",
        "packages/cuvil-backend-ascend",
    ],
    "serve": [
        "packages/cuvil-ir",
        "packages/cuvil-runtime",
        "packages/cuvil-core",
        "packages/cuvil-serve",
    ],
}
ALL = PACKAGES["cpu"]
#: the serving package (docs/serving.md) beside the cpu target: its HTTP dependencies
#: (starlette, uvicorn) are installed only where its tests run (``tests``, ``tests_pkg``)
SERVE = [*ALL, "packages/cuvil-serve"]
#: the serving tests' HTTP client (tests over real HTTP on loopback); a test dependency only
HTTPX = "httpx"
#: the cuda target's tests run in their own session (``tests_cuda``): triton is big and
#: the kernels run in Triton's interpreter, on CPU tensors (docs/cuda-backend.md)
CUDA = [*ALL, "packages/cuvil-backend-cuda"]
#: the ascend target's simulation runs beside the cpu target (a test compares their random numbers)
ASCEND = [*ALL, "packages/cuvil-backend-ascend"]
#: triton for the cuda target, beside the CPU torch wheel (it does not depend on torch)
TRITON = "triton"
#: Ascend's Triton (its own ``triton/`` package: never in an environment with upstream
#: triton); ``--no-deps``: it would pull a torch of its choosing
TRITON_ASCEND = ["triton-ascend", "pybind11"]
FAST = ["-m", "not slow and not device"]
#: the optional integrations the tests exercise (extras cuvil-ir[mlir], cuvil[onnx]); none
#: of them depends on torch, so the pinned CPU torch stays
INTEGRATIONS = ["torch-mlir", "onnx", "onnxruntime", "onnxscript"]


def install(session: nox.Session, folders: list[str], *extra: str) -> None:
    """One pip command, so sibling dependencies named plainly (``cuvil-ir``) resolve to the folders."""
    editable = [arg for folder in folders for arg in ("-e", folder)]
    session.install(*TORCH, *extra, *editable)


def tests_dirs(session: nox.Session, folders: list[str]) -> list[str]:
    """The packages' tests folders; a package without one yet is named, not an error
    (git keeps no empty folder, so a fresh clone lacks it)."""
    found = []
    for folder in folders:
        if (ROOT / folder / "tests").is_dir():
            found.append(f"{folder}/tests")
        else:
            session.warn(f"{folder} has no tests/ folder yet")
    if not found:
        session.skip("no tests to run")
    return found


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's fast tests in one environment (what CI runs), the optional
    integrations (ONNX, MLIR) included."""
    install(session, SERVE, PYTEST, HYPOTHESIS, HATCHLING, TRANSFORMERS, TORCHAO, HTTPX, *INTEGRATIONS)
    session.run("pytest", *tests_dirs(session, SERVE), "-q", *FAST, *session.posargs)
    if not session.posargs:  # a selection (``nox -s tests -- -k x``) runs only what it names
        run_isas(session)
        # the whole suite: the cuda and ascend targets', the plugins' and the AArch64 sessions follow
        for name in ("tests_cuda", "tests_ascend", "tests_ascend_compile", "tests_plugins", "tests_arm64"):
            session.notify(name)


@nox.session
def tests_cuda(session: nox.Session) -> None:
    """The cuda target's tests without a GPU: its kernels run in Triton's interpreter on
    CPU tensors (``TRITON_INTERPRET=1``) and are compiled ahead of time to PTX for sm_90;
    the conformance corpus included. Part of ``tests`` (it follows it), alone here."""
    install(session, CUDA, PYTEST, TRITON)
    env = {"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    session.run("pytest", "packages/cuvil-backend-cuda/tests", "-q", *FAST, *session.posargs, env=env)


@nox.session
def tests_ascend(session: nox.Session) -> None:
    """The ascend target without an NPU: ``CUVIL_ASCEND_SIM=1`` runs its kernels in upstream
    Triton's interpreter on CPU tensors under Ascend's launch rules; the conformance corpus
    included (docs/ascend-backend.md). Part of ``tests`` (it follows it), alone here."""
    install(session, ASCEND, PYTEST, TRITON)
    env = {"CUVIL_ASCEND_SIM": "1", "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    session.run("pytest", "packages/cuvil-backend-ascend/tests", "-q", *FAST, *session.posargs, env=env)


#: says which triton is installed; the compile check must not run beside upstream triton
WHICH_TRITON = """
from cuvil_backend_ascend.declared import has_triton_ascend, triton_root
assert has_triton_ascend(), f"the triton at {triton_root()} is not triton-ascend's"
print("triton-ascend at", triton_root())
"""


@nox.session
def tests_ascend_compile(session: nox.Session) -> None:
    """Every kernel the ascend target generates for the corpus, through triton-ascend's
    ``make_ttir`` and ``ttir_to_linalg`` (no CANN needed), in an environment whose
    ``triton`` is triton-ascend's and never upstream's. Part of ``tests``, alone here."""
    install(session, PACKAGES["ascend"], PYTEST)
    session.install("--no-deps", *TRITON_ASCEND)
    session.run("python", "-c", WHICH_TRITON)
    session.run(
        "pytest", "packages/cuvil-backend-ascend/tests/test_ascend_compile.py", "-q", *session.posargs
    )


#: the template plugin distributions third parties copy (docs/plugins.md)
EXAMPLES = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "examples").iterdir()
    if p.is_dir() and p.name.startswith(("cuvil-ops-", "cuvil-backend-"))
)


@nox.session
def tests_plugins(session: nox.Session) -> None:
    """The example op library and target (``examples/cuvil-ops-*``, ``examples/cuvil-backend-*``),
    built and installed as a third party's distributions are (not editable), and their
    tests: the target runs the conformance corpus. Part of ``tests``, alone here."""
    install(session, ALL, PYTEST, TRITON)
    session.install("--no-deps", *EXAMPLES)
    env = {"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    session.run("pytest", *(f"{e}/tests" for e in EXAMPLES), "-q", *FAST, *session.posargs, env=env)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The differential fuzzer with a long, random budget (docs/testing.md): 2000
    programs unless ``CUVIL_FUZZ_EXAMPLES`` says otherwise."""
    install(session, ALL, PYTEST, HYPOTHESIS)
    env = {"CUVIL_FUZZ_EXAMPLES": session.env.get("CUVIL_FUZZ_EXAMPLES", "2000")}
    session.run("pytest", "packages/cuvil-core/tests/test_fuzz.py", "-q", *session.posargs, env=env)


@nox.session
@nox.parametrize("package", [nox.param(pkg, id=pkg) for pkg in PACKAGES])
def tests_pkg(session: nox.Session, package: str) -> None:
    """One package's fast tests, in an environment holding only it and its dependencies."""
    folders = PACKAGES[package]
    extra = [TRANSFORMERS, HTTPX] if package == "serve" else []
    install(session, folders, PYTEST, HATCHLING, *extra, *INTEGRATIONS)
    session.run("pytest", *tests_dirs(session, folders[-1:]), "-q", *FAST, *session.posargs)


#: The ISAs ``tests_isa`` forces on the cpu target ($CUVIL_CPU_ISA, docs/cpu-backend.md): the
#: paths an AVX-512 development host never takes by itself.
ISAS = ["avx2", "portable"]
#: What runs per ISA: the program corpus, one to two minutes on 2 cores with a cold kernel cache.
ISA_TESTS = [
    "packages/cuvil-backend-cpu/tests/test_conformance.py",
    "packages/cuvil-backend-cpu/tests/test_row_kernels.py",  # softmax/log_softmax/layer_norm rows
    "packages/cuvil-backend-cpu/tests/test_half.py",  # float16/bfloat16 conversions and rounding
    "packages/cuvil-backend-cpu/tests/test_quant_linear.py",  # bf16/int8/int4 weight-only linears
    "packages/cuvil-backend-cpu/tests/test_packed_gemm.py",  # float32 linears on packed weights
    "packages/cuvil-backend-cpu/tests/test_shared_input_linears.py",  # the grouped GEMV
    "packages/cuvil-backend-cpu/tests/test_paged_attention.py",  # paged attention over block tables
    "packages/cuvil-backend-cpu/tests/test_decode_attention.py",  # a decode step's, over a static cache
]
#: Says whether this CPU can run $CUVIL_CPU_ISA's code (an aarch64 host cannot run avx2 kernels).
CAN_RUN_ISA = """
from cuvil_backend_cpu import toolchain as t
try:
    print("ok", t.isa_flags(t.requested_isa(), t.cpuinfo()))
except t.ToolchainError as e:
    print("cannot:", e)
"""


def run_isas(session: nox.Session, *args: str) -> None:
    """The cpu corpus once per forced ISA in :data:`ISAS`; an ISA this CPU cannot run is
    skipped, saying why."""
    for isa in ISAS:
        env = {"CUVIL_CPU_ISA": isa}
        answer = session.run("python", "-c", CAN_RUN_ISA, env=env, silent=True)
        if answer is None:  # --install-only
            return
        cannot = [line for line in answer.splitlines() if line.startswith("cannot:")]
        if cannot:
            session.warn(f"CUVIL_CPU_ISA={isa}: skipped, {cannot[0]}")
            continue
        session.log(f"the cpu corpus with kernels built for CUVIL_CPU_ISA={isa}")
        session.run("pytest", *ISA_TESTS, "-q", *FAST, *args, env=env)


@nox.session
def tests_isa(session: nox.Session) -> None:
    """The cpu target's conformance corpus, kernels built for each of :data:`ISAS`
    ($CUVIL_CPU_ISA); part of ``tests`` too, alone here."""
    install(session, ALL, PYTEST)
    run_isas(session, *session.posargs)


#: The AArch64 levels ``tests_arm64`` builds kernels for (docs/cpu-backend.md, "AArch64").
ARM64_LEVELS = ["armv8-a", "armv8.2-a", "sve", "sve2"]
#: What runs at every level, kernels cross-compiled and run under qemu-aarch64: the whole
#: program corpus and the row kernels (about a minute a level on 2 cores, cold).
ARM64_TESTS = [
    "packages/cuvil-backend-cpu/tests/test_conformance.py",
    "packages/cuvil-backend-cpu/tests/test_row_kernels.py",
]
#: The hand-written kernels' own tests (quant_linear.c, packed_gemm.c, attention.c, paged_attention.c and its
#: decode entry point), at the NEON baseline and
#: at sve (256-bit vectors) only: under qemu's SVE they take a minute and a half a level, and
#: their C is the same NEON branch at every level (tests_arm64 stays near 6 minutes)
ARM64_KERNEL_TESTS = [
    "packages/cuvil-backend-cpu/tests/test_quant_linear.py",
    "packages/cuvil-backend-cpu/tests/test_packed_gemm.py",
    "packages/cuvil-backend-cpu/tests/test_attention_kernel.py",
    "packages/cuvil-backend-cpu/tests/test_paged_attention.py",
    "packages/cuvil-backend-cpu/tests/test_decode_attention.py",
]
ARM64_KERNEL_LEVELS = ["armv8-a", "sve"]
#: Debian's names for the cross compiler (and its C library, libgomp) and for qemu-aarch64
#: the cross compiler, its C library's headers and objects (only a *recommendation* of the
#: compiler's package: ``--no-install-recommends`` leaves them out, and Debian's multiarch cross
#: gcc then reads the host's /usr/include and fails on ``bits/libc-header-start.h``), qemu
ARM64_APT = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user"]
#: what must be there besides the tools on PATH
ARM64_FILES = ["/usr/aarch64-linux-gnu/include/stdio.h"]


def apt_install(
    session: nox.Session, packages: list[str], tools: list[str], files: list[str] | None = None
) -> str | None:
    """Install Debian ``packages`` unless their ``tools`` are on PATH and their ``files`` exist
    already; ``None`` when done, else why they cannot be installed here (no apt, no root, no
    mirror)."""
    if all(shutil.which(t) for t in tools) and all(Path(f).exists() for f in files or ()):
        return None
    if shutil.which("apt-get") is None:
        return f"no apt-get here to install {' '.join(packages)} (a Debian or Ubuntu host has it)"
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return f"installing {' '.join(packages)} needs root, and this is uid {os.geteuid()} without sudo"
        sudo = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_cmd = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", *packages]
    for attempt in (install_cmd, [*sudo, "apt-get", "update"], install_cmd):
        session.log(" ".join(attempt))
        proc = subprocess.run(attempt, capture_output=True, text=True, env=env)
        if proc.returncode == 0 and attempt is install_cmd:
            return None
        if proc.returncode != 0 and attempt[-1] == "update":
            break  # no mirror: installing again would fail the same way
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
    return f"{' '.join(attempt)} failed (exit status {proc.returncode}): {tail}"


@nox.session
def tests_arm64(session: nox.Session) -> None:
    """The cpu target's kernels for each of :data:`ARM64_LEVELS`, built by the AArch64 cross
    compiler and run under qemu-aarch64 ($CUVIL_CPU_ISA=level, $CUVIL_CPU_EMULATE=qemu):
    :data:`ARM64_TESTS` (and :data:`ARM64_KERNEL_TESTS` at two levels) compare every result
    with eager on this host. Installs
    :data:`ARM64_APT` with apt, or skips saying why it cannot."""
    why = apt_install(session, ARM64_APT, ["aarch64-linux-gnu-gcc", "qemu-aarch64"], ARM64_FILES)
    if why is not None:
        session.skip(f"the AArch64 cross compiler and qemu are not installed: {why}")
    install(session, ALL, PYTEST)
    session.run(
        "pytest",
        "packages/cuvil-backend-cpu/tests/test_aarch64.py",
        "packages/cuvil-backend-cpu/tests/test_emulated.py",
        "-q",
        *session.posargs,
    )
    for level in ARM64_LEVELS:
        session.log(f"the cpu corpus with kernels built for CUVIL_CPU_ISA={level}, run under qemu-aarch64")
        env = {"CUVIL_CPU_ISA": level, "CUVIL_CPU_EMULATE": "qemu"}
        tests = [*ARM64_TESTS, *(ARM64_KERNEL_TESTS if level in ARM64_KERNEL_LEVELS else [])]
        session.run("pytest", *tests, "-q", *FAST, *session.posargs, env=env)


#: the Ray Serve example's own dependency (examples/serve): never a dependency of a package
RAY_SERVE = "ray[serve]"


@nox.session
def slow(session: nox.Session) -> None:
    """The tests marked slow (device tests stay off: no accelerator here), the Ray Serve
    example's included, then the cuda and ascend targets' slow tests (their corpus in half
    precision) in Triton's interpreter, as tests_cuda and tests_ascend run them."""
    install(
        session,
        [*SERVE, "packages/cuvil-backend-cuda", "packages/cuvil-backend-ascend"],
        PYTEST,
        RAY_SERVE,
        TRANSFORMERS,
        TRITON,
        HTTPX,
    )
    # Exit code 5 (every test deselected) only means nothing is marked slow yet.
    session.run(
        "pytest",
        *tests_dirs(session, SERVE),
        "examples/serve/tests",
        "-q",
        "-m",
        "slow and not device",
        *session.posargs,
        success_codes=[0, 5],
    )
    interpret = {"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    for folder, env in (
        ("packages/cuvil-backend-cuda/tests", interpret),
        ("packages/cuvil-backend-ascend/tests", {**interpret, "CUVIL_ASCEND_SIM": "1"}),
    ):
        session.run(
            "pytest",
            folder,
            "-q",
            "-m",
            "slow and not device",
            *session.posargs,
            env=env,
            success_codes=[0, 5],
        )


@nox.session
def serve_example(session: nox.Session) -> None:
    """examples/serve: a Cuvil artifact served by Ray Serve on loopback, checked against eager."""
    install(session, ALL, PYTEST, RAY_SERVE)
    session.run("pytest", "examples/serve/tests", "-q", "-m", "slow", *session.posargs)


@nox.session
def serve_llm_ray(session: nox.Session) -> None:
    """cuvil-serve's LLM server as a Ray Serve deployment with two replicas, on loopback: answers
    equal generate()'s, a killed replica loses no retried request (also part of ``slow``)."""
    install(session, SERVE, PYTEST, RAY_SERVE, TRANSFORMERS, HTTPX)
    session.run(
        "pytest", "packages/cuvil-serve/tests/test_ray_serve.py", "-q", "-m", "slow", *session.posargs
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and no import cycles among the modules of packages/*/src (docs/testing.md)."""
    session.install(RUFF, GRIMP, PYTEST)
    session.run("ruff", "check", "packages", "examples", "noxfile.py", "tools")
    session.run("ruff", "format", "--check", "packages", "examples", "noxfile.py", "tools")
    session.run("python", "tools/check_import_cycles.py")
    session.run("pytest", "tools/test_check_import_cycles.py", "-q")  # the check catches cycles


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy: strict on cuvil_ir, default strictness on the packages not yet widened."""
    # pytest: cuvil.testing.conformance imports it; the integrations are typed against
    install(
        session,
        [*CUDA, "packages/cuvil-backend-ascend", "packages/cuvil-serve"],
        MYPY,
        PYTEST,
        TRITON,
        TRANSFORMERS,
        *INTEGRATIONS,
    )
    session.run("mypy", "--strict", "packages/cuvil-ir/src/cuvil_ir")
    session.run(
        "mypy",
        "packages/cuvil-runtime/src/cuvil_runtime",
        "packages/cuvil-core/src/cuvil",
        "packages/cuvil-backend-cpu/src/cuvil_backend_cpu",
        "packages/cuvil-backend-cuda/src/cuvil_backend_cuda",
        "packages/cuvil-backend-ascend/src/cuvil_backend_ascend",
        "packages/cuvil-serve/src/cuvil_serve",
    )


@nox.session
def demo(session: nox.Session) -> None:
    install(session, ALL)
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """eager vs torch.compile vs Cuvil (benchmarks/README.md); ``nox -s bench -- --quick --workloads head``."""
    install(
        session, SERVE, "matplotlib", "psutil", "onnx", "onnxruntime", TRANSFORMERS, HTTPX
    )  # the zoo workloads
    session.run("python", "-m", "benchmarks.run", *session.posargs)
    # QPS of a serving loop (sync vs submit, against onnxruntime) and warm starts
    session.run("python", "-m", "benchmarks.serve", "--out", "benchmarks/results/serve.json")
    # the LLM server under 16 concurrent clients vs one-at-a-time generate() (a few minutes,
    # bounded by --max-seconds per run): benchmarks/results/serve_llm/latest.md
    session.run("python", "-m", "benchmarks.serve_llm")
    # LLM decode and prefill per precision (benchmarks.llm, ~30 min): opt in with
    # CUVIL_BENCH_LLM=1, or =peers to add onnxruntime-genai (--no-deps: its requirements would
    # replace the pinned torch); llama.cpp builds from source, by hand (benchmarks/README.md)
    llm = os.environ.get("CUVIL_BENCH_LLM")
    if llm:
        session.install(TORCHAO)
        if llm == "peers":
            session.install("--no-deps", "onnxruntime-genai==0.18.0", "onnx-ir")
        session.run("python", "-m", "benchmarks.llm", "--size", "issue")


SMOKE = """
import torch, cuvil as cu
backends = {b.name: b for b in cu.backends()}
assert "cpu" in backends, f"no cpu target registered: {sorted(backends)}"
assert backends["cpu"].available, backends["cpu"].reason
f = cu.compile(lambda x, y: torch.softmax(x @ y + 1.0, dim=-1).sum(0), target="cpu", fallback="error")
for n in (8, 3):
    x, y = torch.randn(n, 16), torch.randn(16, 4)
    torch.testing.assert_close(f(x, y), torch.softmax(x @ y + 1.0, dim=-1).sum(0))
assert f.stats.compiles == 1, f.stats
assert [a.target for a in f.artifacts] == ["cpu"], f.artifacts
print("compiled for the cpu target from the wheelhouse:", f.stats)
"""


def index_requirements(folders: list[str]) -> list[str]:
    """The third-party requirements of these distributions (sympy, rich ...), without torch.

    torch is left out: it is named first, pinned (see [Note: pinning torch]).
    """
    projects = [tomllib.loads((ROOT / f / "pyproject.toml").read_text())["project"] for f in folders]
    ours = {canonicalize_name(p["name"]) for p in projects} | {"torch"}
    reqs: list[str] = []
    for project in projects:
        for req in project.get("dependencies", []):
            if canonicalize_name(Requirement(req).name) not in ours and req not in reqs:
                reqs.append(req)
    return reqs


#: what ``pip install cuvil[ascend]`` must bring of ours, and what it must never bring
ASCEND_WHEELS = {"cuvil", "cuvil-ir", "cuvil-runtime", "cuvil-backend-ascend"}
ASCEND_NEVER = {"triton", "triton-ascend", "torch-npu", "cuvil-backend-cpu", "cuvil-backend-cuda"}
LIST_DISTRIBUTIONS = """
import importlib.metadata as m
print(" ".join(sorted({d.metadata["Name"].lower() for d in m.distributions()})))
"""


def wheel_venv(session: nox.Session, name: str, wheelhouse: Path, requirement: str) -> Path:
    """A fresh venv with pinned torch and ``requirement`` from our wheels only."""
    venv = Path(session.create_tmp()).resolve() / name
    session.run("python", "-m", "venv", "--clear", str(venv))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    # torch first, pinned (see [Note: pinning torch]); our distributions' other
    # third-party dependencies (sympy, rich) from the index in the same command.
    session.run(*pip, *TORCH, *index_requirements(ALL), external=True)
    # --no-index: our wheels only (everything else is already there), never a
    # same-named distribution from an index.
    session.run(*pip, "--no-index", "--find-links", str(wheelhouse), requirement, external=True)
    return venv


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every distribution's wheel; install ``cuvil[cpu]`` from them into a fresh venv
    and smoke-test it; install ``cuvil[ascend]`` into another and check what it brought."""
    wheelhouse = ROOT / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    folders = [*ALL, "packages/cuvil-backend-cuda", "packages/cuvil-backend-ascend"]
    session.run("python", "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheelhouse), *folders)

    venv = wheel_venv(session, "wheel-venv", wheelhouse, "cuvil[cpu]")
    python = str(venv / "bin" / "python")
    # Run from the temporary folder (the demo copied there) so nothing from the
    # source tree can be imported.
    shutil.copy(ROOT / "examples" / "demo.py", venv / "demo.py")
    with session.chdir(venv):
        listing = session.run(str(venv / "bin" / "cuvil"), "backends", external=True, silent=True)
        if listing is not None:  # None: --install-only skipped it
            print(listing, end="")
            if not any(line.split()[:2] == ["cpu", "yes"] for line in listing.splitlines()):
                session.error("`cuvil backends` does not list the cpu target as available")
        session.run(python, "-c", SMOKE, external=True)
        session.run(python, "demo.py", external=True)

    venv = wheel_venv(session, "wheel-venv-ascend", wheelhouse, "cuvil[ascend]")
    with session.chdir(venv):
        names = session.run(
            str(venv / "bin" / "python"), "-c", LIST_DISTRIBUTIONS, external=True, silent=True
        )
        listing = session.run(str(venv / "bin" / "cuvil"), "backends", external=True, silent=True)
    if names is not None and listing is not None:
        installed = set(names.split())
        ours = {n for n in installed if n.startswith("cuvil")}
        if ours != ASCEND_WHEELS or installed & ASCEND_NEVER:
            session.error(f"cuvil[ascend] installed {sorted(ours)} and {sorted(installed & ASCEND_NEVER)}")
        print(listing, end="")
        if not any(line.split()[:2] == ["ascend", "no"] for line in listing.splitlines()):
            session.error("`cuvil backends` does not list the ascend target (unavailable: no CANN here)")
