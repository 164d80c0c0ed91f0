"""Which cache folders Cuvil may read code from, and the per-user key that signs their entries.

A cache holds things that run: compiled kernels (shared objects that are loaded)
and compiled programs (which carry C source that is built and loaded, and a
wrapper that is executed). Anyone who can write such a file can run code as the
next user who compiles. So a cache folder is used only when no one else can
write into it, checked as OpenSSH checks ``~/.ssh`` (its ``StrictModes``):

* the folder itself is owned by the current user and is not group- or
  world-writable (folders Cuvil creates are mode 0700);
* every folder above it is owned by the current user or by root, and is either
  not writable by others or sticky (``/tmp``: others may add names there but not
  rename or delete ours).

A folder that fails is not used: :func:`trusted_dir` warns once, with the reason
and how to fix it, and hands back a private temporary folder instead (the
process still compiles, it just starts cold). A folder that cannot be created or
written (a read-only cache) is handled the same way.

On top of that, every entry is signed: :func:`cache_secret` is a random key kept
in the cache folder (mode 0600), and entries carry an HMAC-SHA256 of their bytes
under it instead of a plain checksum. An entry copied in from elsewhere, or
written by someone who can write the files but cannot read the key, does not
verify and is rebuilt. See docs/security.md.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: the mode of every folder the caches create
DIR_MODE = 0o700
#: the name of the key file in a cache folder
SECRET_NAME = ".cuvil-key"


class UntrustedCacheWarning(UserWarning):
    """A cache folder was not used because others could write to it (or it is not writable)."""


#: what a write into a cache folder that cannot take it raises: full disk or quota, read-only
#: file system or folder, a file where a folder should be, a file too large
FULL_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EFBIG,
        errno.ENOTDIR,
        errno.EEXIST,
    }
)


_lock = threading.Lock()
_decided: dict[Path, Path] = {}  # requested folder -> the folder to use
_secrets: dict[Path, bytes] = {}
_private: list[Path] = []


def _euid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def _problem(path: Path, st: os.stat_result, *, leaf: bool) -> str | None:
    """Why ``path`` (already ``lstat`` ed as ``st``) lets another user write into it, or ``None``."""
    me = _euid()
    if me < 0:  # pragma: no cover - not POSIX: no owners to check
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link" if leaf else None  # an ancestor link is resolved below
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if leaf:
        if st.st_uid != me:
            return f"{path} is owned by uid {st.st_uid}, not by you (uid {me})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o})"
        return None
    if st.st_uid not in (me, 0):
        return f"{path} (a folder above the cache) is owned by uid {st.st_uid}, neither you nor root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{path} (a folder above the cache) is writable by others and not sticky (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_dir(path: Path) -> str | None:
    """Why ``path`` (an existing folder) cannot hold trusted cache entries, or ``None`` when it can."""
    try:
        problem = _problem(path, os.lstat(path), leaf=True)
        if problem:
            return problem
        for parent in path.resolve().parents:
            problem = _problem(parent, os.stat(parent), leaf=False)
            if problem:
                return problem
    except OSError as e:
        return f"cannot inspect {path}: {e.strerror or e}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable by you (a read-only cache)"
    return None


def check_file(path: Path) -> str | None:
    """Why ``path`` (a file of code a user chose, such as an ahead-of-time artifact) could
    have been written by someone other than its owner, or ``None``: it must be a regular
    file owned by you or root, not group- or world-writable, in folders that pass the
    rule for the folders above a cache (owned by you or root, not writable by others
    unless sticky). A symbolic link is judged by what it points to."""
    me = _euid()
    try:
        real = path.resolve(strict=True)
        st = os.stat(real)
    except OSError as e:
        return f"cannot open {path}: {e.strerror or e}"
    if me < 0:  # pragma: no cover - not POSIX
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid not in (me, 0):
        return f"{path} is owned by uid {st.st_uid}, neither you (uid {me}) nor root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o}); chmod go-w it"
    for parent in real.parents:
        try:
            problem = _problem(parent, os.stat(parent), leaf=False)
        except OSError as e:
            return f"cannot inspect {parent}: {e.strerror or e}"
        if problem:
            return problem
    return None


def make_dirs(path: Path) -> None:
    """``mkdir -p`` whose new folders are mode 0700 (whatever the umask)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # another process made it meanwhile; check_dir decides whether it is usable
        os.chmod(folder, DIR_MODE)  # mkdir's mode is masked by the umask


def private_dir(purpose: str, parent: Path | None = None) -> Path:
    """A fresh folder only this process uses (mode 0700), in ``parent`` (default: the
    system's temporary folder), removed at exit."""
    folder = Path(
        tempfile.mkdtemp(prefix=f".cuvil-{purpose}-" if parent else f"cuvil-{purpose}-", dir=parent)
    )
    with _lock:
        if not _private:
            atexit.register(_remove_private)
        _private.append(folder)
    return folder


def _remove_private() -> None:
    for folder in _private:
        shutil.rmtree(folder, ignore_errors=True)


def trusted_dir(path: Path | str, purpose: str = "cache") -> Path:
    """``path`` created as needed (0700) when only this user can write there, else a private
    temporary folder, with one :class:`UntrustedCacheWarning` saying why and how to fix it.

    The answer is remembered per path for the life of the process, except that a
    folder deleted meanwhile (``cuvil cache clear``, ``rm -rf``) is made again and
    checked again (someone else may have made it in between), and a private folder
    deleted meanwhile is replaced by a fresh one.
    """
    path = Path(path).absolute()
    with _lock:
        known = _decided.get(path)
    if known is not None:
        if os.path.isdir(known):
            return known
        if known != path:  # our private folder was removed (a cleaned /tmp): a fresh one
            with _lock:
                _decided.pop(path, None)
            return _decide(path, purpose, None)
        with _lock:
            _secrets.pop(path, None)  # its key went with it: make or read the new folder's
    return _decide(path, purpose, known)


def _decide(path: Path, purpose: str, before: Path | None) -> Path:
    try:
        make_dirs(path)
    except OSError as e:  # a read-only or full file system, a file in the way
        return fall_back(path, purpose, e)
    problem = check_dir(path)
    if problem is None:
        chosen = path
    else:
        chosen = private_dir(purpose)
        warnings.warn(
            f"cuvil: not using the {purpose} folder {path}: {problem}. Compiling into the private "
            f"folder {chosen} for this process instead (no warm start). To fix: use a folder only "
            "you can write (chmod 700 it, or point CUVIL_CACHE_DIR at one).",
            UntrustedCacheWarning,
            stacklevel=4,
        )
    with _lock:
        if before is None:
            return _decided.setdefault(path, chosen)
        _decided[path] = chosen
        return chosen


_fallen: set[int] = set()  # the errnos a fall_back warned about (one warning each per process)


def fall_back(path: Path | str, purpose: str, error: OSError) -> Path:
    """The folder to use instead of ``path`` (a trusted folder a write into failed with
    ``error``: a full disk, a read-only folder): a private folder of this process (mode
    0700, :func:`tempfile.mkdtemp`) from now on, with one :class:`UntrustedCacheWarning`
    naming ``path`` and the reason (one per kind of failure and process, however many
    stores hit it). A ``path`` already replaced keeps its replacement."""
    path = Path(path).absolute()
    with _lock:
        known = _decided.get(path)
    if known is not None and known != path and os.path.isdir(known):
        return known
    chosen = private_dir(purpose)
    reason = error.strerror or str(error)
    code = error.errno if error.errno is not None else -1
    with _lock:
        _decided[path] = chosen
        first = code not in _fallen
        _fallen.add(code)
    if first:
        warnings.warn(
            f"cuvil: cannot write the {purpose} folder {path} ({reason}"
            f"{f': {error.filename}' if error.filename else ''}: a read-only or full cache?). "
            f"Compiling into the private folder "
            f"{chosen} for the rest of this process instead (other cache folders that fail the same "
            "way are replaced too, without another warning). To fix: free space, or point "
            "CUVIL_CACHE_DIR at a writable folder.",
            UntrustedCacheWarning,
            stacklevel=3,
        )
    return chosen


def recoverable(error: OSError) -> bool:
    """Whether a failed write into a cache folder is worth a retry: the folder was deleted
    (``ENOENT``: made again) or cannot take it (:data:`FULL_ERRNOS`: a private folder)."""
    return error.errno == errno.ENOENT or error.errno in FULL_ERRNOS


def writing(path: Path | str, purpose: str, op: Callable[[Path], T]) -> T:
    """``op(folder)`` with ``folder`` the one :func:`trusted_dir` chose for ``path``. When it
    raises an ``OSError`` because the folder was deleted meanwhile, ``op`` runs again (the
    folder is made again); when the folder cannot be written (full, read-only: see
    :data:`FULL_ERRNOS`), ``op`` runs again in the private folder :func:`fall_back`
    chooses. Nothing stays broken for the rest of the process."""
    for attempt in range(4):
        folder = trusted_dir(path, purpose)
        try:
            return op(folder)
        except OSError as e:
            if attempt == 3 or not recoverable(e):
                raise
            if e.errno != errno.ENOENT:
                fall_back(path, purpose, e)
    raise AssertionError  # pragma: no cover


def cache_secret(folder: Path) -> bytes:
    """The random key that signs entries in ``folder`` (a trusted folder): read from
    ``folder/.cuvil-key`` (mode 0600, ours), created on first use."""
    with _lock:
        known = _secrets.get(folder)
    if known is not None:
        return known
    path = folder / SECRET_NAME
    key = _read_secret(path)
    if key is None:
        fresh = secrets.token_bytes(32)
        tmp = folder / f".{SECRET_NAME}.{os.getpid()}-{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if os.write(fd, fresh) != len(fresh):
                raise OSError(errno.ENOSPC, "short write of the cache key", str(tmp))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made its key first: then use theirs
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        key = _read_secret(path)
        if key is None:
            raise PermissionError(f"cuvil: the cache key {path} is not a private file of yours")
    with _lock:
        return _secrets.setdefault(folder, key)


def _read_secret(path: Path) -> bytes | None:
    data = read_private_file(path, others=0o077)  # nobody else may even read a key
    return data if data is not None and len(data) == 32 else None


def sign(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` under ``key``."""
    return hmac.new(key, data, hashlib.sha256).digest()


def verify(key: bytes, data: bytes, tag: bytes) -> bool:
    return hmac.compare_digest(sign(key, data), tag)


def read_private_file(path: Path, others: int = 0o022) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of ours without any of the mode
    bits ``others`` (by default: nobody else may write it), not following a symbolic
    link; else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        me = _euid()
        if not stat.S_ISREG(st.st_mode) or (me >= 0 and (st.st_uid != me or st.st_mode & others)):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


__all__ = [
    "DIR_MODE",
    "UntrustedCacheWarning",
    "cache_secret",
    "check_dir",
    "check_file",
    "fall_back",
    "make_dirs",
    "private_dir",
    "read_private_file",
    "recoverable",
    "sign",
    "trusted_dir",
    "verify",
    "writing",
]
