"""What ``cuvil cache info|clear|verify`` does: look at, check and empty the on-disk caches.

The cache root (:func:`cuvil_runtime.cache.default_cache_dir`) holds one *store*
per folder that has a signing key (``.cuvil-key``, :mod:`cuvil_runtime.trust`):
``cpu-programs``, ``cuda-programs`` ... (program caches) and ``cpu-kernels``
(compiled kernels). A store's entries come in the two signed formats Cuvil writes:

* a :class:`~cuvil_runtime.cache.DiskCache` file: a header with the payload's
  length and HMAC, then the payload;
* a binary with a sidecar: ``<key>.so`` and ``<key>.hmac`` holding the hex HMAC of
  the binary's bytes (with the kernel's source ``<key>.c`` beside them).

``verify`` checks every entry's HMAC under its store's key (what a load would
check) and reports the damaged ones; ``--delete`` removes them, so the next
compile rebuilds them. ``clear`` removes the stores (only folders with a
``.cuvil-key``: a cache root pointed at a folder of other files loses none of
them) and the toolchain records.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from cuvil_runtime import trust
from cuvil_runtime.cache import _MAGIC, _decode, default_cache_dir

#: files of a store that are not entries themselves
_SIDE_SUFFIXES = (".hmac", ".c", ".json", ".tmp")


@dataclass
class StoreInfo:
    """One store: its folder, entry count and bytes on disk, and damaged entries (after verify)."""

    path: Path
    entries: int = 0
    bytes: int = 0
    damaged: list[Path] = field(default_factory=list)


def stores(root: Path | None = None) -> list[StoreInfo]:
    """Every store under ``root`` (default: the cache root), sorted by name, with sizes."""
    root = Path(root) if root is not None else default_cache_dir()
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (p / trust.SECRET_NAME).is_file()):
        info = StoreInfo(folder)
        for f in _files(folder):
            info.bytes += f.stat().st_size
            if _is_entry(f):
                info.entries += 1
        out.append(info)
    return out


def _files(folder: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        # per-process folders of loaded copies (trust.private_dir) are not entries
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".cuvil-"))
        out += [Path(dirpath) / n for n in sorted(filenames) if n != trust.SECRET_NAME]
    return out


def _is_entry(f: Path) -> bool:
    return not f.name.startswith(".") and not f.name.endswith(_SIDE_SUFFIXES)


def verify(root: Path | None = None, delete: bool = False) -> list[StoreInfo]:
    """:func:`stores` with every entry checked; ``delete`` removes the damaged ones."""
    infos = stores(root)
    for info in infos:
        key = trust.cache_secret(info.path) if trust.check_dir(info.path) is None else None
        for f in _files(info.path):
            if not _is_entry(f):
                continue
            if key is None or not _entry_ok(f, key):
                info.damaged.append(f)
                if delete:
                    for p in (f, f.with_suffix(".hmac")):
                        p.unlink(missing_ok=True)
    return infos


def _entry_ok(f: Path, key: bytes) -> bool:
    data = trust.read_private_file(f)
    if data is None:
        return False
    if f.suffix == ".so":
        tag = trust.read_private_file(f.with_suffix(".hmac"))
        return tag is not None and trust.sign(key, data).hex().encode() == tag.strip()
    return data.startswith(_MAGIC) and _decode(key, data) is not None


def clear(root: Path | None = None) -> int:
    """Remove every store and toolchain record under ``root``; returns the bytes freed."""
    freed = 0
    for info in stores(root):
        freed += info.bytes
        shutil.rmtree(info.path, ignore_errors=True)
    return freed


__all__ = ["StoreInfo", "clear", "stores", "verify"]
