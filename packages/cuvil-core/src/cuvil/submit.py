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
  the first submission: how many compiled programs run at once.
* **Done callbacks** run after the function's queue is handed on (the next call may
  start meanwhile), on a thread that holds no worker slot: a callback may submit
  again, and may wait on that call's result, without deadlock. A thread is added
  whenever work is queued and no thread is idle, so a blocked callback never keeps
  a call from starting; at most ``workers`` programs run at once all the same.
* **Exit**: the pool's threads are not daemons. Every submitted call completes
  before the interpreter exits -- the pending ones after the main thread returns,
  those a non-daemon thread is waiting on, and those submitted from done callbacks
  during shutdown -- as ThreadPoolExecutor's exit join does; idle threads end as
  soon as the interpreter starts shutting down (``threading._register_atexit``), so
  an idle pool does not hold the process.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_LOCK = threading.Lock()
_POOL: _Pool | None = None
_WORKERS: int | None = None


def set_workers(n: int) -> None:
    """How many submitted calls run at once (before the first submission)."""
    global _WORKERS
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_workers takes a positive int, got {n!r}")
    with _LOCK:
        if _POOL is not None:
            raise RuntimeError("the submission pool is already running: set its size before the first submit")
        _WORKERS = n


class _Pool:
    """Non-daemon threads taking tasks from one deque; a thread is started whenever a
    task waits and no thread is idle, and ``slots`` bounds the programs running at once."""

    def __init__(self, workers: int) -> None:
        self.slots = threading.BoundedSemaphore(workers)
        self._cond = threading.Condition(threading.Lock())
        self._tasks: deque[Callable[[], None]] = deque()
        self._idle = 0
        self._threads = 0
        self._exiting = False
        try:
            # called by threading._shutdown before it joins the non-daemon threads
            threading._register_atexit(self._exit)  # type: ignore[attr-defined]
        except RuntimeError:  # created while the interpreter shuts down
            self._exiting = True

    def start(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._tasks.append(task)
            if len(self._tasks) <= self._idle:
                self._cond.notify()
                return
            self._threads += 1
            name = f"cuvil-submit-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=False).start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._tasks:
                    if self._exiting:
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                task = self._tasks.popleft()
            task()  # never raises: _Queue._step catches everything

    def _exit(self) -> None:
        with self._cond:
            self._exiting = True
            self._cond.notify_all()


def _pool() -> _Pool:
    global _POOL
    with _LOCK:
        if _POOL is None:
            n = _WORKERS or int(os.environ.get("CUVIL_SUBMIT_WORKERS", "2"))
            _POOL = _Pool(max(1, n))
        return _POOL


def _forget_pool() -> None:
    """In a forked child the parent's threads do not exist: start a fresh pool."""
    global _POOL, _LOCK
    _LOCK = threading.Lock()
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


class SerialQueue:
    """Runs one compiled function's submitted calls in order on the shared pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        #: a pool task owns the queue (runs its next call); at most one at a time
        self._active = False

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        result: Future[Any] = Future()
        with self._lock:
            self._pending.append((result, fn))
            if self._active:
                return result
            self._active = True
        _pool().start(self._step)
        return result

    def _step(self) -> None:
        """Run the next call that was not cancelled; hand the queue on (to a new pool
        task when calls remain) before completing its Future, so that done callbacks
        -- which run on this thread -- may submit to this function and wait."""
        while True:
            with self._lock:
                if not self._pending:
                    self._active = False
                    return
                result, fn = self._pending.popleft()
            if result.set_running_or_notify_cancel():
                break
        pool = _pool()
        error: BaseException | None = None
        value: Any = None
        with pool.slots:
            try:
                value = fn()
            except BaseException as e:  # the caller sees it in result()
                error = e
        with self._lock:
            more = bool(self._pending)
            if not more:
                self._active = False
        if more:
            pool.start(self._step)
        if error is None:
            result.set_result(value)
        else:
            result.set_exception(error)
            del error


__all__ = ["SerialQueue", "set_workers"]
