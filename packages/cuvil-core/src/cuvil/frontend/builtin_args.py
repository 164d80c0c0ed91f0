"""Size predicates passed where a torch builtin takes a plain ``bool``.

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
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cuvil.frontend.tracer import Tracer

#: (module, function name) -> the parameters that take a bool
BOOL_PARAMETERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("torch.nn.functional", "scaled_dot_product_attention"): ("is_causal", "enable_gqa"),
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


@contextlib.contextmanager
def decided() -> Iterator[None]:
    """While the block runs (a capture), the builtins of :data:`BOOL_PARAMETERS` decide a
    SymBool argument before their parser sees it."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE == 0:
            for (mod, name), params in BOOL_PARAMETERS.items():
                m = importlib.import_module(mod)
                fn = getattr(m, name)
                _ORIGINALS[(mod, name)] = fn
                setattr(m, name, _wrap(fn, f"{mod}.{name}", params))
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


__all__ = ["BOOL_PARAMETERS", "decided"]
