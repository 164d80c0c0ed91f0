"""The ``cpu`` target's step runner: ``step_runner.c``, which runs a native run of a program's
steps in one call ([Note: native runs] in :mod:`cuvil_runtime.native_runs`).

Written once (not generated) and built by the target's kernel cache like the hand-written
kernels; a kernel cache whose kernels run emulated (another ISA under an emulator) has none:
its kernels take tensors, not addresses, and run from Python.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuvil_backend_cpu.emulation import EmulatedLibrary
from cuvil_backend_cpu.kernel_cache import KernelCache, per_cache
from cuvil_runtime.native_runs import MAX_ARGS

#: the runner's source (no vector prelude: it only calls functions)
SOURCE = (Path(__file__).parent / "step_runner.c").read_text()


class StepRunner:
    """``step_runner.c`` built and loaded from ``cache``; ``fn(head_address) -> 0 | 1 + failed step``."""

    def __init__(self, cache: KernelCache) -> None:
        lib = cache.load(cache.build(SOURCE, name="step_runner"), SOURCE, name="step_runner")
        self.fn: Callable[[int], int] | None = None
        if not isinstance(lib, EmulatedLibrary):
            limit = lib.cuvil_run_steps_max_args
            limit.restype = ctypes.c_int64
            if limit() != MAX_ARGS:  # (the planner's limit and the runner's switch must agree)
                raise RuntimeError(f"step_runner.c takes {limit()} arguments a step, the planner {MAX_ARGS}")
            fn = lib.cuvil_run_steps
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int64
            self.fn = fn


def runner(cache: KernelCache) -> Callable[[int], int] | None:
    """The step runner of ``cache`` (built once per cache), or ``None`` under emulation."""
    return per_cache(StepRunner, cache).fn


def address(fn: Any) -> int:
    """The address of a loaded C function (a ``ctypes`` function of a ``CDLL``)."""
    value = ctypes.cast(fn, ctypes.c_void_p).value
    assert value is not None
    return value


__all__ = ["SOURCE", "StepRunner", "address", "runner"]
