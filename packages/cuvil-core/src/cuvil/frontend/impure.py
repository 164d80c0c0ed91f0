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
        self._reads.guard_once(
            ("environ", key),
            ReadGuard(
                f"environment variable {key!r}",
                functools.partial(os.environ.get, key, MISSING),
                "value",
                value,
                show(value),
                ("environ", key),
            ),
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
        self._reads.guard_once(
            ("environ", None),
            ReadGuard(
                "the environment", lambda: dict(os.environ), "contents", contents_key(env), "os.environ"
            ),
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


# -- torch's process state: queries guarded by value -------------------------------------

#: (module, name) of calls that read torch's process-wide settings. Called from
#: converted code, the result is a Python value that capture freezes into the program
#: (``if torch.is_grad_enabled():``), so each call becomes a guard on its result: a
#: changed setting recompiles, here and in a warm start (place ``("query", module,
#: name, *args)``). torch's default dtype is guarded on every capture, read or not
#: (:func:`default_dtype`): factory functions and number promotion consult it, also
#: inside library code.
QUERIES: frozenset[tuple[str, str]] = frozenset(
    ("torch", n)
    for n in (
        "get_default_dtype",
        "is_grad_enabled",
        "is_inference_mode_enabled",
        "are_deterministic_algorithms_enabled",
        "is_deterministic_algorithms_warn_only_enabled",
        "get_deterministic_debug_mode",
        "get_float32_matmul_precision",
        "get_num_threads",
        "get_num_interop_threads",
        "is_anomaly_enabled",
        "is_anomaly_check_nan_enabled",
        "is_autocast_enabled",
        "get_autocast_dtype",
        "is_autocast_cache_enabled",
        "is_warn_always_enabled",
    )
)

_PLAIN_ARGS = (str, int, bool, type(None))


def query(fn: Any) -> tuple[str, str] | None:
    """``fn``'s (module, name) when it reads a torch process setting (:data:`QUERIES`)."""
    if isinstance(fn, types.FunctionType):
        fn = inspect.unwrap(fn)
    key = (getattr(fn, "__module__", None), getattr(fn, "__name__", None))
    return key if key in QUERIES else None  # type: ignore[return-value]


def guarded_query(
    reads: Any, key: tuple[str, str], fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call the query ``fn`` and guard its result by value (re-read on every call)."""
    value = fn(*args, **kwargs)
    plain = not kwargs and all(type(a) in _PLAIN_ARGS for a in args)
    shown_args = ", ".join(repr(a) for a in args)
    what = f"{key[0]}.{key[1]}({shown_args})" if plain else f"{key[0]}.{key[1]}(...)"
    reads.guard_once(
        ("query", what),
        ReadGuard(
            what,
            functools.partial(fn, *args, **kwargs),
            "value",
            value,
            show(value),
            ("query", *key, *args) if plain else None,
        ),
    )
    return value


def default_dtype(reads: Any) -> None:
    """Guard torch's default dtype (every capture: see :data:`QUERIES`)."""
    guarded_query(reads, ("torch", "get_default_dtype"), torch.get_default_dtype, (), {})


def query_getter(place: tuple[Any, ...]) -> Any:
    """A warm start's reader of the query at ``place`` (``("query", module, name, *args)``)."""
    module, name, *args = place[1:]
    if (module, name) not in QUERIES:
        return None
    fn = getattr(sys.modules.get(module), name, None)
    return None if fn is None else functools.partial(fn, *args)


__all__ = [
    "IMPURE",
    "QUERIES",
    "EnvironReads",
    "default_dtype",
    "getenv",
    "guarded_query",
    "query",
    "query_getter",
    "refusal",
]
