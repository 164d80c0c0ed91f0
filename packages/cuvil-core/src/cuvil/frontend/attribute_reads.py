"""Which attributes of a module its unconverted code reads while a capture runs.

[Note: recorded attribute reads]
A module whose ``forward`` runs as it is (torch.nn's, a library's such as
transformers') reads its attributes where no read hook sees them, so its state guard
covered its whole ``__dict__`` ([Note: module state guards] in
:mod:`cuvil.frontend.object_state`). Then state the code never reads was a recompile:
transformers' ``generate()`` keeps its static cache and the cache's length on the
model (``self._cache``, ``self._previous_max_cache_length``), so each ``generate()``
with a new length compiled the forward again, for an attribute no forward reads.

While a capture runs, each such module of the compiled module's tree is an instance of
a *recording subclass* of its class (same name, module and qualname; ``__class__`` is
assigned before the call and restored after it, in ``finally``). Its
``__getattribute__`` notes every attribute name read on the instance -- found in the
instance dict, found on the class, or missing -- for the capture of this thread (a
context variable; other threads using the module meanwhile are not recorded). The
state guard then covers what was read: each read name's value in the instance dict,
or its absence from it (``hasattr(self, "_x")`` false at capture and ``_x`` set later
is a change, and so is an instance attribute that would now shadow a method). Code
that reads ``__dict__`` itself (``vars(self)``, ``self.__dict__``) gets the whole-dict
guard as before. Reads made by Cuvil's own code are not recorded (except the modules it
ships for models, :data:`_MODEL_CODE`, whose code is a model's) (converted code reads
through the read hooks, each read its own guard, ``getattr``/``hasattr``/``vars`` too),
except those of what ``hooks.call`` runs as it is for the traced code (a builtin
reading the module). ``nn.Module.__getattr__`` finds parameters, buffers and
submodules through ``self.__dict__``; the recording class answers those three from the dict it
reads without recording, so a parameter read is not a whole-dict read.

Where no recording is possible the whole-dict guard stays: a class that defines its
own ``__getattribute__``, an instance whose ``__class__`` cannot be assigned, a module
the capture met outside the compiled module's tree (a global, an argument), and a
module whose code reads its attributes with ``object.__getattribute__`` (which
bypasses any class: torch's and transformers' forward paths do not). Swaps are
counted per module under one lock, so two captures running one module at once (two
compiled functions of one model in two threads) restore the class only when the last
one ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

import torch

#: the reads of the capture running in this context: module id -> attribute names
_RECORDER: contextvars.ContextVar[dict[int, set[str]] | None] = contextvars.ContextVar(
    "cuvil_attribute_reads", default=None
)
#: module id -> [module, its class, captures using the swap]
_SWAPPED: dict[int, list[Any]] = {}
_LOCK = threading.Lock()
#: original class -> its recording subclass (None: its class cannot record)
_CLASSES: dict[type, type | None] = {}
#: the three dicts ``nn.Module.__getattr__`` looks in
_SLOTS = ("_parameters", "_buffers", "_modules")
#: the name meaning "read the whole instance dict"
WHOLE = "__dict__"
#: Cuvil's own source files: their reads are not the traced code's (converted code's
#: reads go through the read hooks, each guarded by itself: cuvil/frontend/reads.py)
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Cuvil's files whose code is a model's, not the compiler's: the modules Cuvil ships for
#: models to hold (``cuvil.quantize.QuantizedLinear``) and the test corpus's; their reads are
#: recorded as any library's (unrecorded, a QuantizedLinear's ``fmt`` went unguarded: a layer
#: switched from "int4" to "int4-a8" kept running the old program)
_MODEL_CODE = (_OWN + "quantize.py", _OWN + "testing" + os.sep)


@functools.lru_cache(maxsize=1024)
def _compiler_file(filename: str) -> bool:
    """Whether code of ``filename`` is Cuvil's compiler (its reads are not the traced code's)."""
    return filename.startswith(_OWN) and not filename.startswith(_MODEL_CODE)


#: Cuvil functions that call what the traced code calls (``hooks.call`` running a builtin
#: or library function as it is): reads made from them are recorded
USER_CALLS: set[types.CodeType] = set()


def _recording_class(cls: type) -> type | None:
    if cls in _CLASSES:
        return _CLASSES[cls]
    if cls.__getattribute__ is not object.__getattribute__ or getattr(cls, "__cuvil_recording__", False):
        _CLASSES[cls] = None
        return None
    get = object.__getattribute__
    module_getattr = torch.nn.Module.__getattr__
    own_getattr = cls.__getattr__  # type: ignore[attr-defined]

    def __getattribute__(self: Any, name: str) -> Any:
        reads = _RECORDER.get()
        if reads is not None:
            names = reads.get(id(self))
            if names is not None:
                code = sys._getframe(1).f_code
                if not _compiler_file(code.co_filename) or code in USER_CALLS:
                    names.add(name)
        return get(self, name)

    def __getattr__(self: Any, name: str) -> Any:
        if own_getattr is not module_getattr:
            return own_getattr(self, name)
        d = get(self, "__dict__")
        for slot in _SLOTS:
            found = d.get(slot)
            if found is not None and name in found:
                return found[name]
        raise AttributeError(f"'{cls.__name__}' object has no attribute '{name}'")

    sub = type(
        cls.__name__,
        (cls,),
        {
            "__getattribute__": __getattribute__,
            "__getattr__": __getattr__,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__cuvil_recording__": True,
        },
    )
    _CLASSES[cls] = sub
    return sub


def _swap(m: torch.nn.Module) -> bool:
    with _LOCK:
        entry = _SWAPPED.get(id(m))
        if entry is not None:
            entry[2] += 1
            return True
        cls = type(m)
        sub = _recording_class(cls)
        if sub is None:
            return False
        try:
            m.__class__ = sub
        except TypeError:
            return False
        _SWAPPED[id(m)] = [m, cls, 1]
        return True


def _unswap(m: torch.nn.Module) -> None:
    with _LOCK:
        entry = _SWAPPED[id(m)]
        entry[2] -= 1
        if entry[2] == 0:
            del _SWAPPED[id(m)]
            m.__class__ = entry[1]


@contextlib.contextmanager
def recording(modules: Iterable[torch.nn.Module]) -> Iterator[dict[int, set[str]]]:
    """Record the attribute names read on ``modules`` while the block runs in this
    context: module id -> names (modules that could not be swapped are absent)."""
    swapped: list[torch.nn.Module] = []
    reads: dict[int, set[str]] = {}
    try:
        for m in modules:
            if id(m) not in reads and _swap(m):
                swapped.append(m)
                reads[id(m)] = set()
        token = _RECORDER.set(reads)
        try:
            yield reads
        finally:
            _RECORDER.reset(token)
    finally:
        for m in swapped:
            _unswap(m)


__all__ = ["WHOLE", "recording"]
