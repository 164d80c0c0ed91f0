"""The launch autotuner: per kernel and size bucket, the fastest of a few configurations.

Measured once (block sizes and warps around the policy's choice), the winner kept
in a JSON file per GPU model under the cache directory (numbers only, read from a
trusted folder: see :mod:`cuvil_runtime.trust`). A kernel may read and write the
same buffer (an in-place elementwise op), so the trial runs work on the real
buffers after a snapshot and the snapshot is restored before the real launch.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from cuvil_runtime import trust


def gpu_timer(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` on the GPU (``triton.testing.do_bench``)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=5, rep=20))


def wall_timer(fn: Callable[[], Any]) -> float:
    """Best of three wall-clock runs in ms (the interpreter has no GPU clock)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best


class Autotuner:
    def __init__(self, folder: Path, device_name: str, timer: Callable[[Callable[[], Any]], float]) -> None:
        self.folder = trust.trusted_dir(folder, "autotune cache")
        self.path = self.folder / (re.sub(r"[^A-Za-z0-9_.-]+", "_", device_name) + ".json")
        self.timer = timer
        self._lock = threading.Lock()
        self.table: dict[str, dict[str, Any]] = self._read()
        #: configurations measured in this process (not read from the file)
        self.measured = 0

    def _read(self) -> dict[str, dict[str, Any]]:
        data = trust.read_private_file(self.path)
        if data is None:
            return {}
        try:
            table = json.loads(data)
        except ValueError:
            return {}  # a damaged file is a miss; the next write replaces it
        return table if isinstance(table, dict) else {}

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.table, f, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # an unwritable cache only costs the next process a measurement

    def pick(
        self,
        kernel: str,
        bucket: str,
        candidates: Sequence[dict[str, Any]],
        run: Callable[[dict[str, Any]], Any],
        buffers: Sequence[Any],
    ) -> dict[str, Any]:
        key = f"{kernel}/{bucket}"
        with self._lock:
            hit = self.table.get(key)
            if hit is not None and hit in candidates:
                return dict(hit)
            snapshot = [b.clone() if isinstance(b, torch.Tensor) else b for b in buffers]
            best: tuple[float, int] | None = None
            for i, c in enumerate(candidates):
                try:
                    t = self.timer(functools.partial(run, c))
                except Exception:  # a configuration the compiler refuses (too many registers ...)
                    continue
                self.measured += 1
                if best is None or t < best[0]:
                    best = (t, i)
            for b, s in zip(buffers, snapshot):
                if isinstance(b, torch.Tensor):
                    b.copy_(s)
            if best is None:
                raise RuntimeError(f"no launch configuration of kernel {kernel} ran")
            winner = dict(candidates[best[1]])
            self.table[key] = winner
            self._write()
            return winner


__all__ = ["Autotuner", "gpu_timer", "wall_timer"]
