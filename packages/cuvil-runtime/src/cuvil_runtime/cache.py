"""Compile caches: compiled executables in memory, byte artifacts on disk.

:class:`CompileCache` keeps the last few :class:`Executable` s of this process,
keyed by what determines them: the graph's stable hash, the target name and the
compile options.

:class:`DiskCache` keeps artifacts (generated sources, compiled kernels) across
processes. A file is named by the sha256 of its key and written atomically: the
bytes go to a temporary file in the same folder, which ``os.replace`` then puts
in place, so a reader sees the old file, the new file or nothing, and
concurrent writers of one key each succeed (the last one wins; for a content
cache both wrote the same bytes). Every file starts with a header holding the
payload's length and its HMAC-SHA256 under the folder's private key
(:func:`cuvil_runtime.trust.cache_secret`); a file that does not match it
(truncated by a crash, a full disk, a torn copy, or written by someone without
the key) is deleted and reported as a miss, never returned. The folder itself is
used only when no other user can write to it (:func:`cuvil_runtime.trust.trusted_dir`).
That check is also why writes skip ``fsync``: after a power loss a file may come
back empty, which reads as a miss.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_runtime import trust
from cuvil_runtime.dump import compile_graph
from cuvil_runtime.target import CompileOptions, Executable, Target

# -- in-process ----------------------------------------------------------------

CacheKey = tuple[str, str, CompileOptions]


class CompileCache:
    """A thread-safe LRU of compiled executables."""

    def __init__(self, maxsize: int = 128) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._items: OrderedDict[CacheKey, Executable] = OrderedDict()
        self._lock = threading.Lock()
        #: keys being compiled -> [the lock their compile holds, threads waiting or compiling]
        self._pending: dict[CacheKey, list[Any]] = {}

    def get(self, graph_hash: str, target: str, options: CompileOptions) -> Executable | None:
        key = (graph_hash, target, options)
        with self._lock:
            exe = self._items.get(key)
            if exe is not None:
                self._items.move_to_end(key)
            return exe

    def put(self, graph_hash: str, target: str, options: CompileOptions, exe: Executable) -> None:
        key = (graph_hash, target, options)
        with self._lock:
            self._items[key] = exe
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def get_or_compile(self, graph: Graph, target: Target, options: CompileOptions) -> Executable:
        """The cached executable, compiling it on a miss.

        One compile per key: a thread missing on a key another thread is compiling
        waits for that compile and takes its result. Different keys compile in
        parallel (the cache's own lock is never held during a compile).
        """
        graph_hash = graph.hash
        exe = self.get(graph_hash, target.name, options)
        if exe is not None:
            return exe
        key = (graph_hash, target.name, options)
        with self._lock:
            pending = self._pending.setdefault(key, [threading.Lock(), 0])
            pending[1] += 1
        try:
            with pending[0]:
                exe = self.get(graph_hash, target.name, options)
                if exe is None:
                    exe = compile_graph(target, graph, options)
                    self.put(graph_hash, target.name, options, exe)
        finally:
            with self._lock:
                pending[1] -= 1
                if pending[1] == 0:
                    del self._pending[key]
        return exe

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


# -- on disk -------------------------------------------------------------------

#: file layout: magic (8 bytes) | payload length (8 bytes, little endian) | HMAC-SHA256 (32 bytes) | payload
_MAGIC = b"CUVIL\x00\x02\n"
_HEADER = len(_MAGIC) + 8 + 32


def default_cache_dir() -> Path:
    """``$CUVIL_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuvil``, else ``~/.cache/cuvil``."""
    explicit = os.environ.get("CUVIL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cuvil"


def _encode(key: bytes, data: bytes) -> bytes:
    return _MAGIC + len(data).to_bytes(8, "little") + trust.sign(key, data) + data


def _decode(key: bytes, blob: bytes) -> bytes | None:
    if len(blob) < _HEADER or not blob.startswith(_MAGIC):
        return None
    n = len(_MAGIC)
    size = int.from_bytes(blob[n : n + 8], "little")
    tag = blob[n + 8 : _HEADER]
    data = blob[_HEADER:]
    if len(data) != size or not trust.verify(key, data, tag):
        return None
    return data


class DiskCache:
    """Content-addressed byte artifacts under ``root`` (default: :func:`default_cache_dir`).

    A ``root`` other users could write to is replaced by a private temporary folder,
    with a warning (see :mod:`cuvil_runtime.trust`). So is one that stops taking
    writes (a full disk, a read-only folder: one warning naming it and why); one
    deleted meanwhile (``cuvil cache clear``) is made again on the next write.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        #: the folder asked for; :attr:`root` is the one in use
        self.requested = Path(root) if root is not None else default_cache_dir()
        trust.writing(self.requested, "cache", trust.cache_secret)  # the key exists (or we fell back)

    @property
    def root(self) -> Path:
        """The folder entries are read from and written to now (see the class doc)."""
        return trust.trusted_dir(self.requested, "cache")

    def path(self, key: str) -> Path:
        """Where the artifact for ``key`` lives (a two-level fan-out keeps folders small)."""
        return self._path(self.root, key)

    @staticmethod
    def _path(root: Path, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return root / digest[:2] / digest

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or ``None`` on a miss or a damaged file."""
        root = self.root
        path = self._path(root, key)
        blob = trust.read_private_file(path)
        if blob is None:  # missing, unreadable or not ours: either way not a usable artifact
            return None
        try:
            secret = trust.cache_secret(root)
        except OSError:  # the folder went away meanwhile: a miss
            return None
        data = _decode(secret, blob)
        if data is None:
            # Damaged: remove it so the next put starts clean. A writer may have
            # replaced it meanwhile; deleting that good file only costs a rebuild.
            try:
                path.unlink()
            except OSError:
                pass
        return data

    def put(self, key: str, data: bytes) -> Path:
        """Store ``data`` under ``key`` atomically; returns the file's path (in a private
        folder when the cache folder cannot take it, see the class doc)."""
        return trust.writing(self.requested, "cache", lambda root: self._put(root, key, bytes(data)))

    def _put(self, root: Path, key: str, data: bytes) -> Path:
        path = self._path(root, key)
        secret = trust.cache_secret(root)
        trust.make_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(secret, data))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


__all__ = ["CompileCache", "DiskCache", "default_cache_dir"]
