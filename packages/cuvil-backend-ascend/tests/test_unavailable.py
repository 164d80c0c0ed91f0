"""The ``ascend`` target outside simulation on a host without an NPU: unavailable,
saying what is missing; its device rule names the argument. Needs no triton
(``nox -s tests_pkg(ascend)`` runs these with only the package's dependencies)."""

from __future__ import annotations

import os
import subprocess
import sys


def _outside_simulation(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("CUVIL_ASCEND_SIM", "TRITON_INTERPRET")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout


def test_unavailable_without_cann_or_simulation_lists_what_is_missing():
    """No CANN, no torch-npu, upstream triton: TargetUnavailableError at the decorator,
    naming each missing piece, its fix, and simulation."""
    out = _outside_simulation(
        "import cuvil as cu\n"
        "try:\n"
        "    cu.compile(lambda x: x + 1, target='ascend')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    assert out.startswith("TargetUnavailableError"), out
    for piece in ("CANN", "ASCEND_HOME_PATH", "torch-npu", "triton-ascend", "CUVIL_ASCEND_SIM=1"):
        assert piece in out, (piece, out)


def test_cpu_tensors_for_the_npu_target_name_the_argument():
    """Outside simulation the target runs npu tensors only; a CPU tensor is refused by name."""
    out = _outside_simulation(
        "import torch\n"
        "from cuvil.arguments import check_tensors\n"
        "from cuvil_backend_ascend.declared import CAPABILITIES\n"
        "try:\n"
        "    check_tensors([torch.randn(2)], ['x'], CAPABILITIES.devices, 'ascend')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    assert out.startswith("CompileError") and "'x'" in out and "npu" in out, out
