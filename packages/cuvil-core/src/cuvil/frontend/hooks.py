"""Runtime helpers called by converted code (see :mod:`cuvil.frontend.convert`).

Converted statements call ``if_``/``while_``/``for_``, which run Python for a
Python condition and record a structured op for a size or tensor condition (see
:mod:`cuvil.frontend.regions`). Constructs that stay Python call ``truth``/
``boolop`` where Python asks a value for its truth and ``iterate`` where it loops
over one: Python values behave exactly as in Python, size predicates are decided
from the example inputs and guarded, and tensor values are rejected with the
construct's source location. ``call`` converts user callees on the fly.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from cuvil.errors import CompileError
from cuvil.frontend.convert import SITES, ConversionError, convert, is_user_function
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.regions import (
    UNROLL_LIMIT,
    SymRange,
    Undefined,
    capture_for,
    capture_if,
    capture_while,
    static_truth,
)

_HINTS = {
    "if": "an `if` inside a loop body that uses `break`/`continue`/`return` stays Python; "
    "restructure the loop, or select with torch.where(cond, a, b)",
    "while": "remove `break`/`continue`/`return` from the loop body so it can be captured as one loop",
    "for": "iterate over range(x.shape[0]) and index, or use tensor ops over the whole axis",
    "assert": "assert on sizes (x.shape) instead; tensor values are only known at run time",
}


def _reject(kind: str, site: int, what: str) -> CompileError:
    return CompileError(
        f"`{kind}` on {what}: this construct needs a Python value, but the value is only known "
        "when the compiled code runs",
        SITES[site].loc,
        _HINTS.get(kind, "use tensor ops (torch.where, torch.logical_and ...) instead of Python truth tests"),
    )


def truth(value: Any, site: int) -> bool:
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor value")
    tracer = _tracer()
    if isinstance(value, torch.SymBool) and tracer is not None:
        tracer.sync()
        result = bool(value)
        where = SITES[site]
        tracer.sync(f"{where.loc}: `{where.kind}` on a size")
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
    if fn is range and any(isinstance(a, torch.SymInt) for a in args):
        return SymRange(*args)
    target = _converted(fn)
    return target(*args, **kwargs)


# -- structured control flow (statements rewritten by control_flow.py) -------------


def load(scope: dict[str, Any], name: str, site: int) -> Any:
    """The current value of a variable, or an :class:`Undefined` marker."""
    if name in scope:
        return scope[name]
    return Undefined(name, SITES[site].loc)


def _tracer() -> Any:
    from cuvil.frontend.tracer import Tracer

    return Tracer.active


def if_(cond: Any, then_fn: Any, else_fn: Any, site: int, values: tuple[Any, ...]) -> Any:
    """A converted ``if``: Python when the condition is a Python value, else one ``if`` op."""
    tracer = _tracer()
    if tracer is not None and isinstance(cond, (TensorProxy, torch.SymBool)):
        if isinstance(cond, torch.SymBool):
            tracer.sync()
            decided = static_truth(tracer, cond)
            if decided is not None:
                return (then_fn if decided else else_fn)(*values)
        return capture_if(tracer, cond, then_fn, else_fn, values, SITES[site].loc)
    if isinstance(cond, TensorProxy):
        raise _reject("if", site, "a tensor value")
    return (then_fn if cond else else_fn)(*values)


def while_(cond_fn: Any, body_fn: Any, site: int, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A converted ``while``: a Python loop, or one ``while`` op when the condition is a tensor."""
    tracer = _tracer()
    cond = cond_fn(*values)
    if tracer is not None and isinstance(cond, (TensorProxy, torch.SymBool)):
        if isinstance(cond, torch.SymBool) and static_truth(tracer, cond) is False:
            return values
        return capture_while(tracer, cond_fn, body_fn, values, names, SITES[site].loc)
    while truth(cond, site):
        values = body_fn(*values)
        cond = cond_fn(*values)
    return values


def for_(iterable: Any, body_fn: Any, site: int, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A converted ``for``: unrolled in Python, or one ``for`` op over a symbolic or long range."""
    tracer = _tracer()
    if isinstance(iterable, TensorProxy):
        raise _reject("for", site, "a tensor (iterating over its rows)")
    if tracer is not None and isinstance(iterable, SymRange):
        return capture_for(tracer, iterable, body_fn, values, names, SITES[site].loc)
    if tracer is not None and isinstance(iterable, range) and len(iterable) > UNROLL_LIMIT and values:
        # no silent unrolling after a failed attempt: the body may have had Python
        # side effects, so a body that needs the index as a Python value is an error
        return capture_for(tracer, iterable, body_fn, values, names, SITES[site].loc)
    for item in iterable:
        values = body_fn(item, *values)
    return values


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
