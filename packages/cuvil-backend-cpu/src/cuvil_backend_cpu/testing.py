"""Helpers for tests of code compiled for the ``cpu`` target."""

from __future__ import annotations

from typing import Any

from cuvil_backend_cpu.backend import CpuExecutable


def executable_of(compiled: Any) -> CpuExecutable:
    """The :class:`CpuExecutable` behind the latest artifact of a ``cu.compile`` result
    (its ``stages``, ``report`` and ``program``)."""
    ex = compiled.artifacts[-1].executable
    if not isinstance(ex, CpuExecutable):
        raise TypeError(f"the latest artifact did not compile for cpu: {type(ex).__name__}")
    return ex
