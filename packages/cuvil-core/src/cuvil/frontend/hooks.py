"""Runtime helpers called by converted code (see :mod:`cuvil.frontend.convert`).

Converted functions call ``truth``/``boolop`` where Python asks a value for its
truth, ``iterate`` where it loops over one, and ``call`` for every call. With
Python values they behave exactly like Python; size comparisons are decided
from the example inputs and guarded; tensor values are rejected here with the
construct's source location (structured control flow will accept them).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from cuvil.errors import CompileError
from cuvil.frontend.convert import SITES, ConversionError, convert, is_user_function
from cuvil.frontend.proxy import TensorProxy

_SUPPORTED_LATER = "control flow on tensor values is not supported yet"


def _reject(kind: str, site: int, what: str) -> CompileError:
    loc = SITES[site].loc
    hints = {
        "if": "compute both branches and select with torch.where(cond, a, b)",
        "while": "use a fixed number of iterations, or run this loop outside the compiled function",
        "for": "iterate over range(x.shape[0]) and index, or use tensor ops over the whole axis",
    }
    return CompileError(
        f"`{kind}` on {what}: {_SUPPORTED_LATER}",
        loc,
        hints.get(kind, "keep tensor values out of Python control flow in compiled code"),
    )


def truth(value: Any, site: int) -> bool:
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor value")
    if isinstance(value, torch.SymBool):
        from cuvil.frontend.tracer import Tracer

        tracer = Tracer.active
        if tracer is not None:
            tracer.sync()
            result = bool(value)
            where = SITES[site]
            tracer.sync(
                f"{where.loc}: `{where.kind}` on a size (specialized; branches on sizes stay symbolic in a later version)"
            )
            return result
    return bool(value)


def boolop(value: Any, site: int) -> Any:
    """An operand of ``and``/``or``: Python tests its truth but yields the value itself."""
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor value")
    return value


def iterate(value: Any, site: int) -> Any:
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor (iterating over its rows)")
    return value


def call(site: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``, converting it first when it is user code (recursively)."""
    target = _converted(fn)
    return target(*args, **kwargs)


def _converted(fn: Any) -> Any:
    import cuvil.frontend.hooks as hooks_module

    try:
        if is_user_function(fn):
            return convert(fn, hooks_module)
        if isinstance(fn, types.MethodType) and is_user_function(fn.__func__):
            return types.MethodType(convert(fn.__func__, hooks_module), fn.__self__)
        if isinstance(fn, torch.nn.Module) and not _has_hooks(fn):
            forward = type(fn).forward
            if is_user_function(forward):
                return types.MethodType(convert(forward, hooks_module), fn)
    except ConversionError:
        pass  # no source: run as is; tensor ops are still captured by the tracer
    return fn


def _has_hooks(m: torch.nn.Module) -> bool:
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or getattr(m, "_forward_hooks_with_kwargs", None)
        or torch.nn.modules.module._global_forward_hooks
        or torch.nn.modules.module._global_forward_pre_hooks
    )
