"""A content-addressed on-disk cache of compiled kernels (shared objects).

A kernel is named by the sha256 of its C source, the toolchain's identity
(compiler, version, CPU, flags) and this package's version, so the same source
always maps to the same file and anything that changes the bytes changes the
name. Layout, with ``key`` that hex digest::

    root/.cuvil-key               the folder's private signing key (mode 0600)
    root/<key[:2]>/<key>.so       the shared object
    root/<key[:2]>/<key>.hmac     HMAC-SHA256 of the .so's bytes under the key (the sidecar)
    root/<key[:2]>/<key>.c        the source, kept to read and to reproduce a build

Why it is safe to share between processes, to crash in, and to load from:

* ``root`` is used only when no other user can write to it (owned by you, not
  group/world-writable, nor any folder above it unless sticky); otherwise a
  private temporary folder is used, with a warning (:mod:`cuvil_runtime.trust`).
  Folders are created 0700.
* The compiler writes to a temporary name (pid + random) in the same folder,
  which ``os.replace`` then moves onto ``<key>.so``; the sidecar is written the
  same way, after the .so. A reader sees a whole file or none.
* A hit is trusted only if the .so's bytes match the sidecar's HMAC, so a
  truncated or corrupted entry (a crash, a full disk, a torn copy), or one
  written by anyone who cannot read the key, is rebuilt, never loaded.
* What is loaded is what was verified: :meth:`KernelCache.load` reads the bytes
  once, checks them, writes that copy into a folder only this process uses and
  ``dlopen`` s the copy, so swapping the cached file after the check changes
  nothing. A verified file the loader still rejects is evicted and rebuilt.
* A miss compiles under a per-kernel ``flock``: a second process wanting the same
  kernel waits, then finds the first one's entry instead of compiling again.
  Without the lock, two writers' .so and sidecar could interleave (A's .so, B's
  sidecar) and leave an entry that never verifies if the bytes ever differed.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import secrets
import shlex
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cuvil_backend_cpu import __version__, emulation
from cuvil_backend_cpu.progress import CompileProgress
from cuvil_backend_cpu.toolchain import Toolchain, ToolchainError, default_kernel_cache_dir, find_toolchain
from cuvil_runtime import trust

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: atomic replace alone still keeps entries whole
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
#: a loaded kernel: in this process, or in the emulated one (:mod:`cuvil_backend_cpu.emulation`)
Library = ctypes.CDLL | emulation.EmulatedLibrary

#: Compiler output lines kept in a :class:`KernelBuildError` (the first errors are the useful ones).
STDERR_LINES = 60


class KernelLoadError(OSError):
    """A cached kernel failed verification or the dynamic loader rejected it."""


class KernelBuildError(RuntimeError):
    """The compiler rejected a kernel. Carries the command, the compiler's output and the kept source."""

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str] = (),
        output: str = "",
        source_path: Path | None = None,
        returncode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.command = list(command)
        self.output = output
        self.source_path = source_path
        self.returncode = returncode

    @classmethod
    def from_compile(
        cls, name: str, command: Sequence[str], returncode: int, output: str, source_path: Path
    ) -> KernelBuildError:
        lines = output.strip().splitlines()
        shown = "\n".join(f"  {line}" for line in lines[:STDERR_LINES])
        if len(lines) > STDERR_LINES:
            shown += f"\n  ... ({len(lines) - STDERR_LINES} more lines)"
        message = (
            f"compiling CPU kernel {name!r} failed (exit status {returncode})\n"
            f"  source:  {source_path}\n"
            f"  command: {shlex.join(command)}\n"
            f"compiler output:\n{shown}"
        )
        return cls(message, command=command, output=output, source_path=source_path, returncode=returncode)


@dataclass
class CacheStats:
    """Lookups that found a valid entry (``hits``), that did not (``misses``), and compiles run (``builds``).

    ``builds`` can be below ``misses``: a miss that waited on another process's
    compile of the same kernel finds its entry and builds nothing.
    """

    hits: int = 0
    misses: int = 0
    builds: int = 0


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (separate opens conflict, so threads exclude each other too).

    Lock files stay: deleting one while another process waits on it would let a
    third lock a fresh file and run alongside.
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class KernelCache:
    """Compiled kernels under ``root`` (default ``<cuvil cache>/cpu-kernels``, honouring ``$CUVIL_CACHE_DIR``).

    A ``root`` that other users could write to (or that is read-only) is replaced
    by a private temporary folder, with a warning. Raises
    :class:`~cuvil_backend_cpu.toolchain.ToolchainError` at construction when
    there is no usable compiler. Thread-safe.
    """

    def __init__(self, toolchain: Toolchain | None = None, root: Path | str | None = None) -> None:
        self.toolchain = toolchain if toolchain is not None else find_toolchain()
        #: the folder asked for; :attr:`root` is the one in use (they differ after a fall back)
        self.requested = Path(root) if root is not None else default_kernel_cache_dir()
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._libs: dict[str, Library] = {}
        self._load_dir: Path | None = None
        self._writing(trust.cache_secret)  # the key exists (or we fell back)

    @property
    def root(self) -> Path:
        """The folder kernels are read from and built into now: :attr:`requested` as long as it
        is trusted and takes writes; made again when deleted meanwhile (``cuvil cache clear``);
        a private folder of this process from the first write it could not take (a full disk,
        a read-only folder), with one warning (:func:`cuvil_runtime.trust.writing`)."""
        return trust.trusted_dir(self.requested, "kernel cache")

    @property
    def _secret(self) -> bytes:
        return trust.cache_secret(self.root)

    def _writing(self, op: Callable[[Path], T]) -> T:
        return trust.writing(self.requested, "kernel cache", op)

    def key(self, source: str) -> str:
        """The kernel's content address: sha256 over the source, the toolchain identity and our version."""
        h = hashlib.sha256()
        for part in ("cuvil-backend-cpu kernel", __version__, self.toolchain.identity, source):
            data = part.encode()
            h.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two part lists hash alike
            h.update(data)
        return h.hexdigest()

    def paths(self, key: str, root: Path | None = None) -> tuple[Path, Path, Path]:
        """``(<key>.so, <key>.c, <key>.hmac)`` for ``key`` (in ``root``, default :attr:`root`)."""
        folder = (root if root is not None else self.root) / key[:2]
        return folder / f"{key}.so", folder / f"{key}.c", folder / f"{key}.hmac"

    def _tag(self, data: bytes) -> str:
        return trust.sign(self._secret, data).hex()

    # -- lookups and builds ----------------------------------------------------------------------------------

    def _count(self, hits: int = 0, misses: int = 0, builds: int = 0) -> None:
        with self._lock:
            self.stats.hits += hits
            self.stats.misses += misses
            self.stats.builds += builds

    def _verified(self, so: Path) -> bytes | None:
        """The bytes of ``so`` if it is our file and they match its sidecar's HMAC, else ``None``."""
        data = trust.read_private_file(so)
        want = trust.read_private_file(so.with_suffix(".hmac"))
        if data is None or want is None:
            return None
        return data if secrets.compare_digest(self._tag(data).encode(), want.strip()) else None

    def _lookup(self, key: str) -> Path | None:
        """The .so for ``key`` if present and verified, else ``None``."""
        so = self.paths(key)[0]
        return so if self._verified(so) is not None else None

    def evict(self, key: str) -> None:
        """Remove ``key``'s .so and sidecar (a damaged entry), so the next build makes it anew."""
        so, _, sidecar = self.paths(key)
        if not so.parent.is_dir():
            return  # nothing to remove (the folder was deleted, or this is a fresh fallback)
        try:
            with _file_lock(so.parent / f".{key}.lock"):
                sidecar.unlink(missing_ok=True)
                so.unlink(missing_ok=True)
        except OSError as e:
            if not trust.recoverable(e):
                raise  # a folder that is gone or takes no writes has nothing to evict from us

    def _compile(self, key: str, source: str, name: str) -> Path:
        """Build the entry for ``key`` unless another thread or process did while we waited for
        the lock; in the folder :attr:`root` is then (see there: deleted, full)."""
        return self._writing(lambda root: self._compile_in(root, key, source, name))

    def _compile_in(self, root: Path, key: str, source: str, name: str) -> Path:
        so, c_path, sidecar = self.paths(key, root)
        trust.make_dirs(so.parent)
        with _file_lock(so.parent / f".{key}.lock"):
            done = self._lookup(key)
            if done is not None:
                return done
            _atomic_write(c_path, source.encode())
            tmp = _tmp_name(so)
            command = self.toolchain.command(c_path, tmp)
            try:
                try:
                    proc = subprocess.run(command, capture_output=True, text=True, errors="replace")
                except OSError as e:
                    raise ToolchainError(
                        f"cannot run the C compiler {command[0]}: {e}; "
                        "install gcc (apt install gcc) or set CC=/path/to/compiler"
                    ) from e
                if proc.returncode != 0:
                    _check_writable(so.parent)  # a full or read-only folder, not the source, failed it
                    output = "\n".join(part for part in (proc.stderr.strip(), proc.stdout.strip()) if part)
                    raise KernelBuildError.from_compile(name, command, proc.returncode, output, c_path)
                digest = self._tag(tmp.read_bytes())
                os.replace(tmp, so)
            finally:
                tmp.unlink(missing_ok=True)
            _atomic_write(sidecar, f"{digest}\n".encode())  # after the .so: a sidecar never vouches for less
        self._count(builds=1)
        return so

    def build(self, source: str, name: str = "kernel") -> Path:
        """The path of the compiled ``source``, compiling it on a miss. ``name`` labels errors.

        Raises :class:`KernelBuildError` when the compiler rejects the source.
        """
        key = self.key(source)
        found = self._lookup(key)
        if found is not None:
            self._count(hits=1)
            return found
        self._count(misses=1)
        return self._compile(key, source, name)

    def build_all(
        self,
        sources: Sequence[tuple[str, str]],
        *,
        progress: bool | None = None,
        label: str = "compiling kernels",
    ) -> list[Path]:
        """Paths for ``(name, source)`` pairs, in order; the misses compile in parallel.

        One ``cc`` process per miss, at most ``os.cpu_count()`` at a time (threads
        just wait on them). A source listed twice compiles once. On a failure the
        queued compiles are cancelled and the first error is raised.
        ``progress=None`` shows a bar by the ``CUVIL_PROGRESS``/terminal rules.
        """
        keys = [self.key(source) for _, source in sources]
        todo: dict[str, tuple[str, str]] = {}
        hits = 0
        for key, (name, source) in zip(keys, sources):
            if key in todo or self._lookup(key) is not None:
                hits += 1
            else:
                todo[key] = (name, source)
        self._count(hits=hits, misses=len(todo))
        if todo:
            workers = min(len(todo), os.cpu_count() or 1)
            with (
                CompileProgress(label, len(todo), enabled=progress) as bar,
                ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cuvil-cc") as pool,
            ):
                futures = [
                    pool.submit(self._compile, key, source, name) for key, (name, source) in todo.items()
                ]
                try:
                    for future in as_completed(futures):
                        future.result()
                        bar.advance()
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise
        return [self.paths(key)[0] for key in keys]

    def load(self, path: Path | str, source: str | None = None, name: str = "kernel") -> Library:
        """The loaded kernel at ``path`` (an entry of this cache), once per path.

        The bytes are read once and verified, and that copy is what is loaded (see
        the module docstring). An entry that does not verify, or that the loader
        rejects, is evicted; with ``source`` (the kernel's C) it is then rebuilt
        and loaded once more, else :class:`KernelLoadError` is raised. Under emulation
        (``toolchain.emulator``) the library is loaded in the emulated process.
        """
        so = Path(path)
        with self._lock:
            lib = self._libs.get(str(so))
        if lib is not None:
            return lib
        try:
            lib = self._load_verified(so)
        except KernelLoadError:
            key = so.stem
            self.evict(key)
            if source is None or self.key(source) != key:
                raise
            self._count(misses=1)
            lib = self._load_verified(self._compile(key, source, name))
        with self._lock:
            return self._libs.setdefault(str(so), lib)

    def _load_verified(self, so: Path) -> Library:
        data = self._verified(so)
        if data is None:
            raise KernelLoadError(f"the cached kernel {so} is missing or does not match its signature")
        if self.toolchain.emulator:
            return self._writing(
                lambda root: emulation.load_library(
                    self.toolchain,
                    data,
                    self._loads(root),
                    so.stem,
                    f"the cached kernel {so}",
                    self._trampoline,
                )
            )
        return self._writing(
            lambda root: load_library(data, self._loads(root), so.stem, f"the cached kernel {so}")
        )

    def _loads(self, root: Path) -> Path:
        """This process's folder of loaded copies in ``root``, made again when it was deleted
        (``cuvil cache clear``) or ``root`` changed; checked like a cache folder, since what
        is loaded from it must stay what was verified (docs/security.md)."""
        with self._lock:
            folder = self._load_dir
            if folder is None or folder.parent != root or not folder.is_dir():
                folder = self._load_dir = trust.private_dir("load", parent=root)
                problem = trust.check_dir(folder)
                if problem is not None:
                    self._load_dir = None
                    raise PermissionError(
                        errno.EACCES, f"not loading kernels from it: {problem}", str(folder)
                    )
            return folder

    def _trampoline(self, source: str) -> emulation.EmulatedLibrary:
        """An emulated call's trampoline (:func:`cuvil_backend_cpu.emulation.trampoline_source`),
        built and loaded as any kernel is."""
        lib = self.load(self.build(source, name="trampoline"), source, name="trampoline")
        assert isinstance(lib, emulation.EmulatedLibrary)
        return lib

    def verified_bytes(self, path: Path | str) -> bytes:
        """The bytes of the entry at ``path`` (from :meth:`build_all`), checked against its signature."""
        data = self._verified(Path(path))
        if data is None:
            raise KernelLoadError(f"the cached kernel {path} is missing or does not match its signature")
        return data


def _check_writable(folder: Path) -> None:
    """Raise the ``OSError`` a write into ``folder`` meets (a full disk, a read-only folder), if any:
    the compiler's own failure to write its output there then reads as that, not as a bad kernel."""
    probe = _tmp_name(folder / "probe")
    try:
        with open(probe, "wb") as f:
            f.write(bytes(1 << 16))
    except OSError as e:
        if trust.recoverable(e):
            raise
    finally:
        probe.unlink(missing_ok=True)


def load_library(data: bytes, folder: Path, stem: str, what: str) -> ctypes.CDLL:
    """``dlopen`` a copy of ``data`` (already verified) written into ``folder`` (a folder only
    this process uses), removed once mapped: nothing is left on disk to swap."""
    copy = folder / f"{stem}-{secrets.token_hex(4)}.so"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            return ctypes.CDLL(str(copy))
        except OSError as e:
            raise KernelLoadError(f"{what} cannot be loaded: {e}") from e
    finally:
        copy.unlink(missing_ok=True)


#: the hand-written kernel libraries (flash attention, quantized linears, paged attention) made
#: from each kernel cache, by class: built and loaded once per cache, whatever calls them
_BUILT: weakref.WeakKeyDictionary[KernelCache, dict[type, object]] = weakref.WeakKeyDictionary()
_BUILT_LOCK = threading.Lock()
_K = TypeVar("_K")


def per_cache(cls: Callable[[KernelCache], _K], cache: KernelCache) -> _K:
    """``cls(cache)``, made once per kernel cache (under a lock: threads calling at once
    build it once) and kept while the cache lives."""
    with _BUILT_LOCK:
        made = _BUILT.setdefault(cache, {})
        found = made.get(cls)  # type: ignore[call-overload]
        if found is None:
            found = made[cls] = cls(cache)  # type: ignore[index]
        return found  # type: ignore[no-any-return]


def built(cls: type) -> bool:
    """Whether some kernel cache has made ``cls`` (tests: the kernel, not the reference, ran)."""
    with _BUILT_LOCK:
        return any(cls in made for made in _BUILT.values())


__all__ = [
    "CacheStats",
    "KernelBuildError",
    "KernelCache",
    "KernelLoadError",
    "built",
    "default_kernel_cache_dir",
    "load_library",
    "per_cache",
]
