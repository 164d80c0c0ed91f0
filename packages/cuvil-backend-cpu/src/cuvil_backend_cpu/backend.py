"""The ``cpu`` target's entry point: Graph IR -> Tensor IR -> Loop IR -> C, compiled in
parallel, cached.

Registered by this distribution's ``cuvil.backends`` entry point ``cpu``.
Importing this module is cheap; the toolchain probe runs in ``check`` (memoised)
and the compile pipeline (:mod:`cuvil_backend_cpu.target`) is imported when the
target is first used.
"""

from __future__ import annotations

from typing import Any

from cuvil_backend_cpu.declared import CAPABILITIES, STAGES
from cuvil_runtime.target import BackendSpec


def _factory() -> Any:
    from cuvil_backend_cpu.target import CpuTarget

    return CpuTarget()


def _loader() -> Any:
    from cuvil_backend_cpu.aot import CpuLoader

    return CpuLoader()


def _check() -> str | None:
    from cuvil_backend_cpu.toolchain import check

    return check()


BACKEND = BackendSpec(
    name="cpu",
    description="fused C kernels with OpenMP threads and SIMD, built by the system C compiler",
    factory=_factory,
    check=_check,
    install="pip install 'cuvil[cpu]'",
    priority=10,
    capabilities=CAPABILITIES,
    stages=STAGES,
    loader=_loader,
)

__all__ = ["BACKEND", "CAPABILITIES", "STAGES"]
