"""Helpers for tests of code compiled for the ``cpu`` target."""

from __future__ import annotations

from typing import Any

from cuvil_runtime.pipeline import ProgramExecutable


def executable_of(compiled: Any) -> ProgramExecutable:
    """The :class:`ProgramExecutable` behind the latest artifact of a ``cu.compile``
    result compiled for ``cpu`` (its ``stages``, ``report`` and ``program``)."""
    art = compiled.artifacts[-1]
    ex = art.executable
    if art.target != "cpu" or not isinstance(ex, ProgramExecutable):
        raise TypeError(f"the latest artifact did not compile for cpu: {art.target}, {type(ex).__name__}")
    return ex
