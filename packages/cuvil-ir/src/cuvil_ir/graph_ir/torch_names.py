"""Stable names for torch callables, so extern nodes print and parse.

``qualname(torch.Tensor.view) == "torch.Tensor.view"``,
``qualname(torch.nn.functional.unfold) == "torch.nn.functional.unfold"``,
and :func:`resolve` maps the name back to the same callable.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

_TENSOR_CLASSES = ("TensorBase", "Tensor")
_FUNCTION_MODULES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft")


def qualname(fn: Any) -> str:
    """A dotted name that :func:`resolve` maps back to ``fn``; ValueError if none."""
    import torch

    if isinstance(fn, torch._ops.OpOverload):  # torch.ops.aten.slice.Tensor
        return f"torch.ops.{fn.namespace}.{fn._opname}.{fn._overloadname}"
    if isinstance(fn, torch._ops.OpOverloadPacket):  # torch.ops.aten.slice
        return f"torch.ops.{fn._qualified_op_name.replace('::', '.')}"
    desc = getattr(fn, "__self__", None)
    if (
        getattr(fn, "__name__", None) == "__get__"
        and getattr(desc, "__objclass__", None) is torch._C.TensorBase
    ):
        # a tensor attribute read that is data, not metadata (``x.real``, ``x.imag``):
        # its method-wrapper is made anew on each access, so it compares equal, not identical
        assert desc is not None  # (its __objclass__ was read above)
        return f"torch.Tensor.{desc.__name__}.__get__"
    name = getattr(fn, "__name__", None)
    if name is None:
        raise ValueError(f"{fn!r} has no name")
    owner = getattr(fn, "__objclass__", None)
    qual = getattr(fn, "__qualname__", name)
    candidates = []
    if owner is not None or qual.split(".")[0] in _TENSOR_CLASSES:
        candidates.append(f"torch.Tensor.{name}")
    candidates += [f"{m}.{name}" for m in _FUNCTION_MODULES]
    module = getattr(fn, "__module__", None)
    if module and "." not in qual:
        candidates.append(f"{module}.{name}")
    for c in candidates:
        try:
            if resolve(c) is fn:
                return c
        except (AttributeError, ImportError, ValueError):
            continue
    del torch
    raise ValueError(f"cannot name the torch callable {fn!r} so that it can be called at run time")


@functools.cache
def resolve(name: str) -> Any:
    """The callable named by :func:`qualname`."""
    if not name.startswith("torch"):
        raise ValueError(f"extern targets must live in torch, got {name!r}")
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"cannot resolve {name!r}")
