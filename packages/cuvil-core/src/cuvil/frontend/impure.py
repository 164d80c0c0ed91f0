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
import functools
import inspect
import os
import random
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cuvil.errors import CompileError
from cuvil.guards import MISSING, ReadGuard, contents_key, show

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




# -- the environment: read through a view that guards each variable ---------------------------


class EnvironReads(Mapping[str, str]):
    """``os.environ`` as converted code sees it while it is captured: every variable it
    reads (``get``, ``[]``, ``in``, ``os.getenv``) becomes a guard on that variable's value
    (unset included), re-read on each call and by a warm start (place ``("environ",
    name)``), so a changed variable recompiles instead of being frozen at capture."""

    def __init__(self, reads: Any) -> None:
        self._reads = reads

    def _read(self, key: str) -> Any:
        value = os.environ.get(key, MISSING)
        seen = ("environ", key)
        if seen not in self._reads._seen:
            self._reads._seen.add(seen)
            self._reads.guards.append(
                ReadGuard(
                    f"environment variable {key!r}",
                    functools.partial(os.environ.get, key, MISSING),
                    "value",
                    value,
                    show(value),
                    ("environ", key),
                )
            )
        return value

    def __getitem__(self, key: str) -> str:
        value = self._read(key)
        if value is MISSING:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        value = self._read(key)
        return default if value is MISSING else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._read(key) is not MISSING

    def _whole(self) -> dict[str, str]:
        env = dict(os.environ)
        if ("environ", None) not in self._reads._seen:
            self._reads._seen.add(("environ", None))
            self._reads.guards.append(
                ReadGuard("the environment", lambda: dict(os.environ), "contents", contents_key(env), "os.environ")
            )
        return env

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def _write(self, *args: Any, **kwargs: Any) -> Any:
        raise CompileError(
            "compiled code changes os.environ",
            None,
            "Python side effects would run once, at compile time, not on every call; set the "
            "variable before calling the compiled function",
        )

    __setitem__ = __delitem__ = setdefault = pop = popitem = update = clear = _write  # type: ignore[assignment]


def getenv(reads: Any, key: str, default: Any = None) -> Any:
    """``os.getenv`` in converted code: a guarded read of the variable."""
    return EnvironReads(reads).get(key, default)


__all__ = ["IMPURE", "EnvironReads", "getenv", "refusal"]
