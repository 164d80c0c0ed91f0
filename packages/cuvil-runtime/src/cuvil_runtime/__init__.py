"""Cuvil runtime: target registry, executor, compile cache, reference target.

Importing this package is cheap (no torch): the executor and caches live in
:mod:`cuvil_runtime.executor` and :mod:`cuvil_runtime.cache`.
"""

from cuvil_runtime.registry import (
    BackendInfo,
    DuplicateTargetError,
    TargetUnavailableError,
    UnknownTargetError,
    default_target,
    discover,
    get_target,
)
from cuvil_runtime.target import BackendSpec, Capabilities, CompileOptions, Executable, Target, TargetError

__all__ = [
    "BackendInfo",
    "BackendSpec",
    "Capabilities",
    "CompileOptions",
    "DuplicateTargetError",
    "Executable",
    "Target",
    "TargetError",
    "TargetUnavailableError",
    "UnknownTargetError",
    "default_target",
    "discover",
    "get_target",
]
