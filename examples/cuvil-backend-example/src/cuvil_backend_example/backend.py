"""The entry point: a cheap :class:`~cuvil_runtime.target.BackendSpec` (importing it
imports neither triton nor the target; ``check`` looks for them)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from cuvil_backend_example.capabilities import CAPABILITIES, STAGES
from cuvil_runtime.target import BackendSpec


def _check() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install triton"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "the example target runs kernels in Triton's interpreter: set TRITON_INTERPRET=1"
    return None


def _factory() -> Any:
    from cuvil_backend_example.target import ExampleTarget

    return ExampleTarget()


BACKEND = BackendSpec(
    name="example",
    description="a template target: Triton kernels in Triton's interpreter on CPU tensors",
    factory=_factory,
    check=_check,
    install="pip install examples/cuvil-backend-example",
    priority=1,  # below every real target: chosen only when asked for by name
    capabilities=CAPABILITIES,
    stages=STAGES,
)
