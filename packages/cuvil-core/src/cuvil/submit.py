"""Asynchronous calls: ``f.submit(*args, **kwargs)`` returns a ``concurrent.futures.Future``.

The caller's thread binds the arguments, checks the guards and compiles when it
must (so an error in the arguments, or a compile error under ``fallback="error"``,
is raised by ``submit`` itself); the compiled program then runs on a thread of a
runtime-owned pool, whose kernels and torch calls release the GIL, so the caller
can prepare the next batch in Python meanwhile.

* **Order**: the calls submitted to one compiled function run one at a time, in
  submission order (FIFO); different functions run in parallel on the pool.
* **Errors** raised while running are set on the Future (``future.result()``
  raises them).
* **Cancellation**: ``future.cancel()`` before the call starts skips it; the calls
  after it still run in order.
* **What is read when**: Python values the compiled code depends on are checked at
  submission (the guards); tensors -- the arguments, a module's parameters, the
  global tensors it reads -- are read when the call runs, so do not modify them
  until its Future is done (as with a CUDA stream).
* **Pool size**: ``CUVIL_SUBMIT_WORKERS`` (default 2), or :func:`set_workers` before
  the first submission.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_WORKERS: int | None = None


def set_workers(n: int) -> None:
    """The number of threads running submitted calls (before the first submission)."""
    global _WORKERS
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"set_workers takes a positive int, got {n!r}")
    with _LOCK:
        if _POOL is not None:
            raise RuntimeError("the submission pool is already running: set its size before the first submit")
        _WORKERS = n


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None:
            n = _WORKERS or int(os.environ.get("CUVIL_SUBMIT_WORKERS", "2"))
            _POOL = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="cuvil-submit")
        return _POOL


class SerialQueue:
    """Runs one compiled function's submitted calls in order on the shared pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: done when the last submitted call has run or been skipped (not the user's
        #: Future: cancelling that one must not let the next call start early)
        self._tail: Future[None] | None = None

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        result: Future[Any] = Future()
        done: Future[None] = Future()

        def run() -> None:
            try:
                if result.set_running_or_notify_cancel():
                    try:
                        result.set_result(fn())
                    except BaseException as e:  # the caller sees it in result()
                        result.set_exception(e)
            finally:
                done.set_result(None)

        with self._lock:
            before, self._tail = self._tail, done
        if before is None:
            _pool().submit(run)
        else:
            before.add_done_callback(lambda _: _pool().submit(run))
        return result


__all__ = ["SerialQueue", "set_workers"]
