"""A progress bar for long kernel compiles, shown only when the wait is long.

Most compiles hit the cache or finish in well under a second, and a bar that
flashes for 200 ms is noise; so the bar appears only if the work is still
running after ``delay`` seconds, on stderr, and vanishes when done (transient).
It stays silent where it would garble output: when stderr is not a terminal
(logs, CI, pytest) unless ``CUVIL_PROGRESS=1`` asks for it, and always under
``CUVIL_PROGRESS=0``. rich is imported only when a bar is actually shown.
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether to show progress: ``False`` or ``CUVIL_PROGRESS=0`` turn it off; ``True`` or
    ``CUVIL_PROGRESS=1`` force it on; otherwise only when stderr is a terminal."""
    env = os.environ.get("CUVIL_PROGRESS", "").strip()
    if enabled is False or env == "0":
        return False
    if enabled is True or env == "1":
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class CompileProgress:
    """``with CompileProgress("compiling kernels", n) as p: ... p.advance()``.

    A background timer starts the rich bar after ``delay`` seconds; ``advance``
    may be called from any thread.
    """

    def __init__(self, label: str, total: int, *, enabled: bool | None = None, delay: float = 1.0) -> None:
        self.label = label
        self.total = total
        self.delay = delay
        self.enabled = progress_enabled(enabled)
        self._force = enabled is True or os.environ.get("CUVIL_PROGRESS", "").strip() == "1"
        self.completed = 0
        self._lock = threading.Lock()
        self._closed = False
        self._timer: threading.Timer | None = None
        self._progress: Any = None  # rich.progress.Progress once shown
        self._task: Any = None
        self.shown = False  #: whether the bar appeared (the work outlasted the delay)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.completed += n
            if self._progress is not None:
                self._progress.update(self._task, completed=self.completed)

    def _show(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )

                console = Console(file=sys.stderr, force_terminal=True if self._force else None)
                progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                    transient=True,
                )
                self._task = progress.add_task(self.label, total=self.total, completed=self.completed)
                progress.start()
            except Exception:  # a cosmetic bar must never break a compile
                return
            self._progress = progress
            self.shown = True

    def __enter__(self) -> CompileProgress:
        if self.enabled and self.total > 0:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._progress is not None:
                try:
                    self._progress.stop()
                finally:
                    self._progress = None


__all__ = ["CompileProgress", "progress_enabled"]
