"""What the ``ascend`` target declares: its mode, capabilities and stages, in order.

A module of its own so that the cheap entry point (:mod:`cuvil_backend_ascend.backend`)
and the target (:mod:`cuvil_backend_ascend.target`) both read them without importing
triton. Two modes, fixed when the process first asks:

* **NPU** (default): ``npu`` tensors, kernels compiled by triton-ascend (its
  ``triton`` package) and launched on the device, matmul and convolution through
  torch-npu (aclnn).
* **Simulation** (``CUVIL_ASCEND_SIM=1``): CPU tensors, every kernel run in upstream
  Triton's interpreter with the NPU's launch rules enforced. Triton decides whether
  it interprets when it is imported, so simulation turns on ``TRITON_INTERPRET=1``
  for the process when nothing set it (:func:`enter_simulation`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from cuvil_runtime.target import GRAPH_STAGE, TENSOR_STAGE, WRAPPER_STAGE, Capabilities, Stage

_FALSE = ("", "0", "false", "no", "off")


def simulating() -> bool:
    """``CUVIL_ASCEND_SIM=1``: kernels in Triton's interpreter, on CPU tensors."""
    return os.environ.get("CUVIL_ASCEND_SIM", "0").strip().lower() not in _FALSE


def triton_root() -> Path | None:
    """The folder of the importable ``triton`` package (found without importing it)."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def has_triton_ascend() -> bool:
    """The importable ``triton`` is triton-ascend's (it has the Ascend backend)."""
    root = triton_root()
    return root is not None and (root / "backends" / "ascend" / "compiler.py").is_file()


def cann_missing() -> str | None:
    """Why CANN is not usable here, or ``None``: ASCEND_HOME_PATH (set by CANN's
    ``set_env.sh``), its ``libhccl.so`` and the ``bishengir-compile`` compiler."""
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if not home:
        return "ASCEND_HOME_PATH is not set"
    libs = [
        Path(home) / sub / "libhccl.so"
        for sub in ("lib64", "lib", "aarch64-linux/lib64", "x86_64-linux/lib64")
    ]
    if not any(p.is_file() for p in libs):
        return f"no libhccl.so under {home}"
    if shutil.which("bishengir-compile") is None and not os.environ.get("TRITON_NPU_COMPILER_PATH"):
        return "bishengir-compile is not on PATH"
    return None


def enter_simulation() -> str | None:
    """Put Triton in interpreter mode for simulation; ``None``, or why it cannot be."""
    setting = os.environ.get("TRITON_INTERPRET")
    if setting is None:
        if "triton" in sys.modules:
            return (
                "CUVIL_ASCEND_SIM=1 runs kernels in Triton's interpreter, but triton was imported "
                "before without TRITON_INTERPRET=1: set TRITON_INTERPRET=1 (or CUVIL_ASCEND_SIM=1) "
                "before triton is first imported"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        return None
    if setting.strip().lower() in _FALSE:
        return (
            f"CUVIL_ASCEND_SIM=1 runs kernels in Triton's interpreter, but TRITON_INTERPRET={setting}: "
            "unset it or set it to 1"
        )
    return None


SIM = simulating()
#: triton-ascend is the installed triton: the ``ttir`` and ``linalg`` stages run
ASCEND_COMPILER = has_triton_ascend()

CAPABILITIES = Capabilities(
    # simulation takes CPU tensors and never npu ones
    devices=frozenset({"cpu"} if SIM else {"npu"}),
    control_flow=True,
    extern_calls=True,
)

TRITON_STAGE = Stage("triton", "each kernel's Triton source, under Ascend's rules", "py", per_kernel=True)
#: where triton-ascend is the installed triton (its compiler's front half; no CANN needed)
COMPILER_STAGES = (
    Stage("ttir", "each kernel as Triton IR, from triton-ascend's make_ttir", "mlir", per_kernel=True),
    Stage(
        "linalg",
        "each kernel in Ascend's Linalg/HIVM form, from triton-ascend's triton-adapter-opt",
        "mlir",
        per_kernel=True,
    ),
)

#: the pipeline, in order (``cu.audit`` and ``CUVIL_DUMP`` list these)
STAGES = (
    GRAPH_STAGE,
    TENSOR_STAGE,
    TRITON_STAGE,
    *(COMPILER_STAGES if ASCEND_COMPILER else ()),
    WRAPPER_STAGE,
)

__all__ = [
    "ASCEND_COMPILER",
    "cann_missing",
    "CAPABILITIES",
    "COMPILER_STAGES",
    "SIM",
    "STAGES",
    "enter_simulation",
    "has_triton_ascend",
    "simulating",
    "triton_root",
]
