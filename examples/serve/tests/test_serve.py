"""The Ray Serve example end to end (slow: starts Ray): a fresh process saves the artifact,
serves it on loopback with two replicas, and every response matches eager."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

RUN = Path(__file__).resolve().parents[1] / "run.py"


@pytest.mark.slow
def test_serve_example_matches_eager() -> None:
    out = subprocess.run(
        [sys.executable, str(RUN), "--requests", "48", "--replicas", "2", "--port", "8766"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "all 48 responses match eager" in out.stdout
