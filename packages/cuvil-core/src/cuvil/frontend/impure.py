"""Calls whose result differs on every call: refused inside compiled code.

A compiled function's Python runs once, at capture, so a call that draws a random
number, reads the clock or makes a new id would give every later call the value of
the first, where eager gets a new one. Such calls are found by one table (functions
by module and name, and the methods of random generator objects) and refused with a
located :class:`CompileError` at the call (with the default ``fallback="eager"`` the
function then runs eagerly). Tensor random ops (``torch.rand``) are not here: they
are graph operations that draw anew on every run.
"""

from __future__ import annotations

import datetime
import inspect
import random
import sys
import types
from typing import Any

import torch

_RANDOM = ("draws a random number", "draw it outside and pass it in (a tensor or a Python number)")
_CLOCK = ("reads the clock", "read the time outside the compiled function and pass it in")
_ID = ("makes a new random id", "make the id outside the compiled function and pass it in")
_SEED = (
    "sets a random generator's state",
    "seed before calling the compiled function",
)

#: (module, name) -> (what the call does, how to avoid it); by name, since importing
#: torch._dynamo replaces ``torch.manual_seed`` with a wrapper of it
IMPURE: dict[tuple[str, str], tuple[str, str]] = {
    **{
        ("time", n): _CLOCK
        for n in (
            "time",
            "time_ns",
            "perf_counter",
            "perf_counter_ns",
            "monotonic",
            "monotonic_ns",
            "process_time",
            "process_time_ns",
            "thread_time",
            "thread_time_ns",
        )
    },
    ("uuid", "uuid1"): _ID,
    ("uuid", "uuid4"): _ID,
    **{(m, n): _RANDOM for m in ("posix", "nt", "os") for n in ("urandom", "getrandom")},
    **{
        ("secrets", n): _RANDOM
        for n in ("token_bytes", "token_hex", "token_urlsafe", "randbelow", "randbits", "choice")
    },
    **{("torch.random", n): _SEED for n in ("manual_seed", "seed", "set_rng_state")},
}

_CLOCK_METHODS = frozenset({"now", "utcnow", "today"})
_GENERATOR_SEEDS = frozenset({"manual_seed", "seed", "set_state"})


def refusal(fn: Any) -> tuple[str, str] | None:
    """(what the call does, a hint) when calling ``fn`` gives another result each call."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        if isinstance(owner, random.Random):  # random.random, randint ... (a hidden instance)
            return _RANDOM
        np = sys.modules.get("numpy")
        if np is not None and isinstance(owner, (np.random.RandomState, np.random.Generator)):
            return _RANDOM
        name = getattr(fn, "__name__", "")
        if isinstance(owner, torch.Generator) and name in _GENERATOR_SEEDS:
            return _SEED
        if isinstance(owner, type) and issubclass(owner, datetime.date) and name in _CLOCK_METHODS:
            return _CLOCK
        return None
    if isinstance(fn, types.FunctionType):
        fn = inspect.unwrap(fn)
    key = (getattr(fn, "__module__", None), getattr(fn, "__name__", None))
    return IMPURE.get(key)  # type: ignore[arg-type]


__all__ = ["IMPURE", "refusal"]
