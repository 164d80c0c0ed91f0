"""An explicit ``$CUVIL_CPU_ISA`` that is unknown or that this CPU cannot run is an error
(issue 26 item 12), never a silent compile for the ``reference`` target.

Each case runs in a child process with the variable set, as a user would: the
default target, ``target="cpu"``, and ``cuvil aot save`` with and without
``--target cpu`` (one line on stderr, no traceback, non-zero exit, no artifact).
The unrunnable level is chosen from this host (CI machines differ: AVX-512 or
AVX2 only); the typo case runs everywhere.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuvil_backend_cpu.toolchain import ToolchainError, cpuinfo, isa_flags

TYPO = "avx51"

_CHILD = textwrap.dedent(
    """
    import sys, warnings, torch
    import cuvil as cu
    from cuvil_runtime.registry import TargetMisconfiguredError
    warnings.simplefilter("error")  # an eager fallback's warning would fail loudly too
    def f(x):
        return torch.relu(x) * 2
    for kw in ({}, {"target": "cpu"}):
        try:  # cu.compile checks an explicit target at once, the default one at the first call
            g = cu.compile(f, **kw)
            g(torch.randn(4))
        except TargetMisconfiguredError as e:
            print("refused", kw.get("target", "default"), "|", e)
        else:
            print("COMPILED", kw.get("target", "default"), g.stats)
    """
)


def _unrunnable_level() -> str | None:
    """An ISA level this CPU cannot run, or ``None`` when it runs every one."""
    info = cpuinfo()
    for level in ("avx512", "avx2"):
        try:
            isa_flags(level, info)
        except ToolchainError:
            return level
    return None


def _env(tmp_path: Path, isa: str) -> dict[str, str]:
    return {
        **os.environ,
        "CUVIL_CPU_ISA": isa,
        "CUVIL_CACHE_DIR": str(tmp_path / "cache"),
        "CUVIL_PROGRESS": "0",
    }


def _compile_in_child(tmp_path: Path, isa: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=_env(tmp_path, isa), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2, proc.stdout
    return lines


def test_typo_is_an_error_for_the_default_target_and_for_cpu(tmp_path):
    lines = _compile_in_child(tmp_path, TYPO)
    for line, which in zip(lines, ("default", "cpu")):
        assert line.startswith(f"refused {which} |"), line
        # what, which value, and what would be valid
        assert f"CUVIL_CPU_ISA={TYPO!r}" in line and "native, avx512, avx2, portable" in line
    assert "not compiling for another target" in lines[0]


def test_unrunnable_level_is_an_error_for_the_default_target_and_for_cpu(tmp_path):
    level = _unrunnable_level()
    if level is None:
        pytest.skip("this CPU runs every CUVIL_CPU_ISA level (AVX-512): no unrunnable one to ask for")
    lines = _compile_in_child(tmp_path, level)
    for line, which in zip(lines, ("default", "cpu")):
        assert line.startswith(f"refused {which} |"), line
        assert f"CUVIL_CPU_ISA={level}" in line
        if platform.machine().lower() in ("x86_64", "amd64"):
            assert "lacks" in line and "illegal instruction" in line  # names the host's missing features


def test_aarch64_level_on_another_machine_is_an_error_saying_how_to_build_it(tmp_path, monkeypatch):
    """An AArch64 level on a machine that cannot run it (every x86-64 host: the case runs
    everywhere but on AArch64), without CUVIL_CPU_EMULATE: refused, naming the two ways."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        pytest.skip("this host runs AArch64 levels")
    monkeypatch.delenv("CUVIL_CPU_EMULATE", raising=False)
    lines = _compile_in_child(tmp_path, "sve")
    for line, which in zip(lines, ("default", "cpu")):
        assert line.startswith(f"refused {which} |"), line
        assert "CUVIL_CPU_ISA=sve builds AArch64 kernels" in line and "cannot run here" in line
        assert "CUVIL_CPU_EXPORT_ISA=sve" in line and "CUVIL_CPU_EMULATE=qemu" in line


@pytest.mark.parametrize("target", [None, "cpu"])
def test_cli_aot_save_reports_one_line_and_writes_nothing(tmp_path, target):
    module = tmp_path / "model.py"
    module.write_text("import torch\n\ndef f(x):\n    return torch.relu(x) * 2\n")
    out = tmp_path / "f.cuvil"
    cmd = [sys.executable, "-m", "cuvil.cli", "aot", "save", f"{module}:f", "--args-spec", "f32[4]"]
    cmd += ["--out", str(out), *(["--target", target] if target else [])]
    proc = subprocess.run(cmd, env=_env(tmp_path, TYPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("cuvil aot save: target 'cpu' is unavailable: ")
    assert f"CUVIL_CPU_ISA={TYPO!r}" in err[0]
    assert not out.exists()  # no reference artifact in its place


def test_default_target_refuses_a_level_this_cpu_cannot_run(monkeypatch):
    """In process, on any host: an AVX2-only CPU (its /proc/cpuinfo) with CUVIL_CPU_ISA=avx512.
    Before, ``default_target`` skipped the unavailable ``cpu`` and answered ``reference``."""
    from cuvil_backend_cpu import toolchain as tc_mod
    from cuvil_runtime.registry import Registry, TargetMisconfiguredError

    zen3 = {"model name": "AMD EPYC 7763", "flags": "fpu sse2 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"}
    monkeypatch.setattr(tc_mod, "_toolchain", tc_mod._toolchain)  # the fake CPU's stays in this test
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(tc_mod, "cpuinfo", lambda: zen3)
    monkeypatch.setenv("CUVIL_CPU_ISA", "avx512")
    registry = Registry()  # the installed entry points, fresh: nothing decided yet
    with pytest.raises(TargetMisconfiguredError) as info:
        registry.default_target("cpu")
    message = str(info.value)
    assert (
        "target 'cpu' is unavailable: CUVIL_CPU_ISA=avx512: this CPU (AMD EPYC 7763) lacks avx512f" in message
    )
    assert "CUVIL_CPU_ISA=avx2" in message  # what to use instead
    monkeypatch.delenv("CUVIL_CPU_ISA")  # fixed: asked again (a failed check is not kept for good)
    monkeypatch.setattr("cuvil_runtime.registry.RECHECK_S", 0.0)
    assert registry.default_target("cpu") == "cpu"
