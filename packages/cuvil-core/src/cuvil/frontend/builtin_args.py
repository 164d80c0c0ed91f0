"""Builtins called with sizes while a capture runs: size predicates passed where a torch
builtin takes a plain ``bool``, and ``min``/``max`` of sizes.

[Note: a SymBool where a builtin takes a bool]
Code that computes a flag from sizes hands torch a ``torch.SymBool`` while a capture
runs: transformers' attention writes ``is_causal = q_length > 1 and mask is None and
is_causal``, and Python's ``and`` yields its first false operand itself, the SymBool
``q_length > 1`` when decoding one token. Functions written in Python take it (their
``if`` decides it, through the tracer's guards), but builtins implemented in C++ parse
their arguments before any ``__torch_function__`` handler sees the call, and their
parser refuses a SymBool for a ``bool`` parameter (``TypeError: scaled_dot_product_
attention(): argument 'is_causal' must be bool, not SymBool``): a Python exception
inside the traced code, so the whole call used to fall back.

While a capture runs, the builtins listed in :data:`BOOL_PARAMETERS` are reached
through a wrapper that decides such an argument first: ``bool(flag)`` under the tracer,
which records the fact about sizes as an assumption of the variant (a call with
``q_length == 1`` and one with ``q_length > 1`` are two variants, each exact), then
calls the builtin with a plain ``bool``. Outside a capture (another thread running
eagerly meanwhile) the wrapper passes everything through unchanged. The wrappers are
installed on the first capture that starts and removed when the last one ends.

[Note: min and max of sizes]
``max(a, b)`` asks ``a < b`` of its operands; on sizes that is a guard, and code that
clamps sizes makes one variant per side of the clamp: transformers' sliding-window
cache computes ``kv_offset = max(cumulative_length - sliding_window + 1, 0)`` every
step, so decoding compiled once while the window filled and again when it was full.
While a capture runs, ``min`` and ``max`` of ints where one is a ``torch.SymInt`` are
``torch.sym_min``/``torch.sym_max`` (as Dynamo does): the result is the size
``Min(a, b)``/``Max(a, b)``, decided per call when sizes are bound, and nothing is
guarded. This holds for converted code and for library code alike (the builtins are
wrapped in :mod:`builtins` for the capture, like the torch builtins above), but not for
torch's own code (its kernels and references decide their clamps as before); any other
call (a key, a default, floats, a generator) is the builtin's own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cuvil.frontend.tracer import Tracer

#: (module, function name) -> the parameters that take a bool
BOOL_PARAMETERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("torch.nn.functional", "scaled_dot_product_attention"): ("is_causal", "enable_gqa"),
}
#: builtins whose size operands stay symbolic ([Note: min and max of sizes])
SIZE_EXTREMES: dict[tuple[str, str], Callable[[Any, Any], Any]] = {
    ("builtins", "min"): torch.sym_min,
    ("builtins", "max"): torch.sym_max,
}

_LOCK = threading.Lock()
_ACTIVE = 0
_ORIGINALS: dict[tuple[str, str], Any] = {}


def _decide(flag: torch.SymBool, reason: str) -> bool:
    """``bool(flag)``, the fact it decides an assumption of the capture running in this
    thread (with ``reason`` as its recompile reason)."""
    tracer = Tracer.current()
    if tracer is None:
        return bool(flag)
    tracer.sync()
    result = bool(flag)
    tracer.sync(reason)
    return result


def _wrap(fn: Callable[..., Any], where: str, params: tuple[str, ...]) -> Any:
    try:
        positions = {n: i for i, n in enumerate(inspect.signature(fn).parameters) if n in params}
    except (TypeError, ValueError):
        positions = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for name in params:
            if isinstance(kwargs.get(name), torch.SymBool):
                kwargs[name] = _decide(kwargs[name], f"{where}: argument {name} is a size predicate")
            i = positions.get(name)
            if i is not None and i < len(args) and isinstance(args[i], torch.SymBool):
                args = (
                    *args[:i],
                    _decide(args[i], f"{where}: argument {name} is a size predicate"),
                    *args[i + 1 :],
                )
        return fn(*args, **kwargs)

    wrapper.__cuvil_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _symbolic_extreme(fn: Callable[..., Any], sym: Callable[[Any, Any], Any]) -> Any:
    """``fn`` (``min`` or ``max``), as ``sym`` over sizes in a capture ([Note: min and max of sizes])."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and Tracer.current() is not None:
            items = args[0] if len(args) == 1 and type(args[0]) in (list, tuple) else args
            if (
                len(items) >= 2
                and all(type(a) is int or type(a) is torch.SymInt for a in items)
                and any(type(a) is torch.SymInt for a in items)
                and not _torch_caller()
            ):
                return functools.reduce(sym, items)
        return fn(*args, **kwargs)

    wrapper.__cuvil_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _torch_caller() -> bool:
    """Whether the caller of the wrapper's caller is torch's own code (its kernels and
    references decide their clamps as they always have)."""
    name = sys._getframe(2).f_globals.get("__name__", "")
    return name == "torch" or name.startswith("torch.")


def _wrappers() -> Iterator[tuple[tuple[str, str], Callable[[Any], Any]]]:
    """Each wrapped builtin's place and how to wrap it."""
    for (mod, name), params in BOOL_PARAMETERS.items():
        yield (mod, name), functools.partial(_wrap, where=f"{mod}.{name}", params=params)
    for place, sym in SIZE_EXTREMES.items():
        yield place, functools.partial(_symbolic_extreme, sym=sym)


@contextlib.contextmanager
def decided() -> Iterator[None]:
    """While the block runs (a capture), the builtins of :data:`BOOL_PARAMETERS` decide a
    SymBool argument before their parser sees it, and those of :data:`SIZE_EXTREMES`
    keep sizes symbolic."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE == 0:
            for (mod, name), wrap in _wrappers():
                m = importlib.import_module(mod)
                fn = getattr(m, name)
                _ORIGINALS[(mod, name)] = fn
                setattr(m, name, wrap(fn))
        _ACTIVE += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE -= 1
            if _ACTIVE == 0:
                for (mod, name), fn in _ORIGINALS.items():
                    setattr(importlib.import_module(mod), name, fn)
                _ORIGINALS.clear()


__all__ = ["BOOL_PARAMETERS", "SIZE_EXTREMES", "decided"]
