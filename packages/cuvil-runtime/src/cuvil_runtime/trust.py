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
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

#: the mode of every folder the caches create
DIR_MODE = 0o700
#: the name of the key file in a cache folder
SECRET_NAME = ".cuvil-key"


class UntrustedCacheWarning(UserWarning):
    """A cache folder was not used because others could write to it (or it is not writable)."""


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

    The answer is remembered per path for the life of the process.
    """
    path = Path(path).absolute()
    with _lock:
        known = _decided.get(path)
    if known is not None:
        return known
    try:
        make_dirs(path)
        problem = check_dir(path)
    except OSError as e:
        problem = f"cannot create {path} ({e.strerror or e}: a read-only cache?)"
    if problem is None:
        chosen = path
    else:
        chosen = private_dir(purpose)
        warnings.warn(
            f"cuvil: not using the {purpose} folder {path}: {problem}. Compiling into the private "
            f"folder {chosen} for this process instead (no warm start). To fix: use a folder only "
            "you can write (chmod 700 it, or point CUVIL_CACHE_DIR at one).",
            UntrustedCacheWarning,
            stacklevel=3,
        )
    with _lock:
        return _decided.setdefault(path, chosen)


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
            os.write(fd, fresh)
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
    "make_dirs",
    "private_dir",
    "read_private_file",
    "sign",
    "trusted_dir",
    "verify",
]
