"""torch's "compiling" flag while captures run, in any number of threads at once.

``torch.compiler.is_compiling()`` is true while a capture runs the function ([Note:
captures count as compiling] in cuvil/frontend/capture.py). torch keeps it in one
process global that its context (``torch.compiler._compile_session_context``) saves on
entry and restores on exit, so two captures overlapping in two threads would restore it
out of order: the one ending last puts back the "compiling" it saw on entry, for good,
and every later eager call believes it is being compiled. So the first capture to
start enters torch's context and the last one to end leaves it (:func:`session`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

_LOCK = threading.Lock()
#: captures in progress in every thread, and the torch context the first one entered
_running = 0
_context: contextlib.AbstractContextManager[Any] | None = None


@contextlib.contextmanager
def session() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` is true inside the block, and false again once
    no capture of any thread is inside one (unless it was true before the first)."""
    global _running, _context
    enter = getattr(torch.compiler, "_compile_session_context", None)
    if enter is None:
        yield
        return
    with _LOCK:
        if _running == 0:
            _context = enter()
            _context.__enter__()
        _running += 1
    try:
        yield
    finally:
        with _LOCK:
            _running -= 1
            if _running == 0 and _context is not None:
                context, _context = _context, None
                context.__exit__(None, None, None)


__all__ = ["session"]
