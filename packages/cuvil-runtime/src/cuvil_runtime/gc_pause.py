"""The cyclic garbage collector paused while a warm start decodes and runs its program.

[Note: warm starts pause the collector]
A process that imported torch holds about 200k objects the collector tracks, and a
full (oldest-generation) collection walks them all: 0.15-0.2 s on a loaded 2-core
host, as much as the rest of a warm ResNet-18 start. Decoding a stored program (its
Tensor IR, graph and kernels' records) makes tens of thousands of objects that live
on, which is what makes the interpreter run such a collection in the middle of the
first call. Paused around that work, the young objects are looked at once when it
ends (a young collection, a few milliseconds) and no full collection is due yet.
Objects freed by reference counting are freed as always; only reference cycles made
inside the window wait for the next collection, and the window is bounded (a warm
lookup and program load, a ``cu.load``, a program's first run), never a capture
(the one compile that can run inside one is the strided variant a first run with a
non-contiguous input builds: [Note: strided inputs] in :mod:`cuvil_runtime.runner`). Nesting and threads are counted: the collector is enabled again when
the last window closes, and only if it was enabled when the first one opened (a
process that turned it off itself keeps it off).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_reenable = False


def pause() -> None:
    """Open a window (see the module doc); every call needs one :func:`resume`."""
    global _depth, _reenable
    with _lock:
        if _depth == 0:
            _reenable = gc.isenabled()
            gc.disable()
        _depth += 1


def resume() -> None:
    """Close a window opened by :func:`pause`."""
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _reenable:
            gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    pause()
    try:
        yield
    finally:
        resume()
