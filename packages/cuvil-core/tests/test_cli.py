"""The ``cuvil`` command line, called in process and as the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil.cli import main


def _reference_row(output: str) -> list[str]:
    [row] = [line.split() for line in output.splitlines() if line.split()[:1] == ["reference"]]
    return row


def test_backends_lists_the_reference_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["TARGET", "AVAILABLE", "DISTRIBUTION", "INSTALL", "REASON"]
    assert _reference_row(out) == ["reference", "yes", "cuvil-runtime", "built", "in"]


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


def test_installed_console_script() -> None:
    # The script pip wrote beside this interpreter (a venv's bin/), else the one on PATH.
    script = Path(sys.executable).with_name("cuvil")
    found = str(script) if script.exists() else shutil.which("cuvil")
    assert found, "the `cuvil` console script is not installed (pip install -e packages/cuvil-core)"
    proc = subprocess.run([found, "backends"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _reference_row(proc.stdout)[:2] == ["reference", "yes"]
