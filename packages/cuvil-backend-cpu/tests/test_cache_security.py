"""The kernel and program caches run no one else's code (docs/security.md).

Each attack here worked before the caches checked who can write them: a planted
shared object with a rewritten sidecar, a forged program entry (a pickle), a
world-writable or foreign-owned cache folder, and a swap between verification
and loading.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cuvil_backend_cpu.kernel_cache import KernelCache, KernelLoadError
from cuvil_runtime import trust
from cuvil_runtime.cache import DiskCache

ADD = "#include <stdint.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }\n"


def evil_source(marker: Path) -> str:
    """A shared object that, once loaded, creates ``marker`` (and exports ``add``)."""
    return textwrap.dedent(
        f"""
        #include <stdint.h>
        #include <stdio.h>
        __attribute__((constructor)) static void pwn(void) {{
            FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("pwned", f); fclose(f); }}
        }}
        int64_t add(int64_t a, int64_t b) {{ return 666; }}
        """
    )


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_PROGRESS", "0")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def build_evil(tmp_path: Path, marker: Path) -> bytes:
    src = tmp_path / "evil.c"
    src.write_text(evil_source(marker))
    out = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


def add_of(lib: ctypes.CDLL) -> int:
    fn = lib.add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    return fn(2, 3)


def test_folders_are_created_private(tmp_path):
    cache = KernelCache(root=tmp_path / "a" / "b" / "kernels")
    path = cache.build(ADD)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", cache.root, path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((cache.root / ".cuvil-key").stat().st_mode) == 0o600


def test_planted_so_with_rewritten_sidecar_is_not_loaded(tmp_path):
    """The attack: replace <key>.so and write its sha256 into the sidecar. The sidecar is
    now an HMAC under a key the attacker cannot read, so the entry is rebuilt."""
    cache = KernelCache(root=tmp_path / "kernels")
    path = cache.build(ADD)
    marker = tmp_path / "pwned"
    evil = build_evil(tmp_path, marker)
    path.write_bytes(evil)
    path.with_suffix(".hmac").write_text(hashlib.sha256(evil).hexdigest() + "\n")

    fresh = KernelCache(root=cache.root)  # the next process
    assert fresh.build(ADD) == path and fresh.stats.builds == 1
    assert add_of(fresh.load(path, ADD)) == 5
    assert not marker.exists()


def test_load_checks_again_and_repairs(tmp_path):
    """A file swapped after lookup (the window between check and dlopen) is caught by load,
    which verifies the very bytes it loads, then evicts and rebuilds the entry."""
    cache = KernelCache(root=tmp_path / "kernels")
    path = cache.build(ADD)
    marker = tmp_path / "pwned"
    path.write_bytes(build_evil(tmp_path, marker))  # after build() returned, before load()
    assert add_of(cache.load(path, ADD)) == 5
    assert not marker.exists()
    with pytest.raises(KernelLoadError):  # without the source there is nothing to rebuild from
        path.write_bytes(b"garbage")
        KernelCache(root=cache.root).load(path)


def test_loaded_code_is_a_private_copy(tmp_path):
    cache = KernelCache(root=tmp_path / "kernels")
    path = cache.build(ADD)
    add_of(cache.load(path, ADD))
    maps = Path("/proc/self/maps").read_text()
    assert str(path) not in maps  # the cache file itself is never mapped
    assert ".cuvil-load-" in maps


def test_verified_garbage_is_evicted_and_rebuilt(tmp_path):
    """A .so whose sidecar matches but which the loader rejects (a torn build signed by a
    buggy writer) used to make every later process fall back; now it is rebuilt."""
    cache = KernelCache(root=tmp_path / "kernels")
    path = cache.build(ADD)
    path.write_bytes(b"\x7fELF not really")
    path.with_suffix(".hmac").write_text(cache._tag(path.read_bytes()) + "\n")
    fresh = KernelCache(root=cache.root)
    assert add_of(fresh.load(path, ADD)) == 5
    assert fresh.stats.builds == 1


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "other owner"])
def test_untrusted_folder_is_refused_with_a_warning(tmp_path, how):
    root = tmp_path / "shared"
    root.mkdir()
    if how == "other owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a folder to another uid")
        os.chown(root, 65534, 65534)
    else:
        os.chmod(root, 0o777 if how == "world-writable" else 0o770)
    with pytest.warns(trust.UntrustedCacheWarning, match="not using") as record:
        cache = KernelCache(root=root / "kernels")
    assert "chmod 700" in str(record[0].message)
    assert not cache.root.is_relative_to(root)
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o700 and cache.root.stat().st_uid == os.geteuid()
    assert add_of(cache.load(cache.build(ADD), ADD)) == 5  # still compiles, into the private folder


def test_untrusted_ancestor_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # not sticky: anyone could rename our folder away
    mine = parent / "mine"
    mine.mkdir(mode=0o700)
    assert "not sticky" in trust.check_dir(mine)
    os.chmod(parent, 0o1777)  # sticky, like /tmp
    assert trust.check_dir(mine) is None


def test_symlinked_cache_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert "symbolic link" in trust.check_dir(link)


def test_forged_program_entry_is_never_unpickled(tmp_path):
    """The attack: a cpu-programs entry holding a pickle whose header checksum is computed
    from the payload. Entries are signed JSON now; the pickle is neither verified nor run."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(Evil())
    code = """
import torch, cuvil as cu
f = cu.compile(lambda x: x * 2 + 1, target="cpu", fallback="error")
x = torch.randn(4)
torch.testing.assert_close(f(x), x * 2 + 1)
"""
    # in fresh processes: this one's in-memory compile cache may already hold the graph
    subprocess.run([sys.executable, "-c", code], check=True)
    store = DiskCache(tmp_path / "cache" / "cpu-programs")
    entries = [p for p in store.root.rglob("*") if p.is_file() and p.name != ".cuvil-key"]
    assert entries
    for entry in entries:  # forge every entry, old-format header with a matching sha256
        entry.write_bytes(
            b"CUVIL\x00\x01\n"
            + len(payload).to_bytes(8, "little")
            + hashlib.sha256(payload).digest()
            + payload
        )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert not marker.exists()
    # and a forged entry in today's format, signed with a key the attacker made up
    for entry in entries:
        entry.write_bytes(b"CUVIL\x00\x02\n" + len(payload).to_bytes(8, "little") + b"\x00" * 32 + payload)
    subprocess.run([sys.executable, "-c", code], check=True)
    assert not marker.exists()


def test_read_only_cache_still_compiles(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through any mode bits")
    root = tmp_path / "ro"
    root.mkdir(mode=0o500)
    with pytest.warns(trust.UntrustedCacheWarning, match="read-only"):
        cache = KernelCache(root=root)
    assert add_of(cache.load(cache.build(ADD), ADD)) == 5


def test_read_only_cache_folder_in_a_fresh_process(tmp_path):
    """A read-only ``CUVIL_CACHE_DIR`` used to make the cpu target fail with an internal
    PermissionError. A read-only file system stops root too: mount one where we may."""
    root = tmp_path / "ro"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,mode=0700", "none", str(root)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a read-only file system here: {mounted.stderr.decode().strip()}")
    else:
        os.chmod(root, 0o500)
        mounted = None
    code = """
import warnings, torch, cuvil as cu
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    f = cu.compile(lambda x: x.relu() + 1, target="cpu", fallback="error")
    x = torch.randn(5)
    out = f(x)
torch.testing.assert_close(out, x.relu() + 1)
assert f.stats.fallbacks == 0, f.stats
print("warned:", any("read-only" in str(m.message) for m in w))
"""
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, CUVIL_CACHE_DIR=str(root)),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "warned: True" in out.stdout
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(root)], check=True)
        else:
            os.chmod(root, 0o700)


def test_warning_is_given_once_per_folder(tmp_path):
    root = tmp_path / "ww"
    root.mkdir()
    os.chmod(root, 0o777)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        a = trust.trusted_dir(root)
        b = trust.trusted_dir(root)
    assert a == b and len([m for m in w if issubclass(m.category, trust.UntrustedCacheWarning)]) == 1


def test_a_fresh_cache_is_private(tmp_path):
    """Every folder a first compile creates (root, kernels, programs, fan-out) is 0700."""
    root = tmp_path / "fresh" / "cuvil"
    code = """
import torch, cuvil as cu
f = cu.compile(lambda x: x.exp() + 1, target="cpu", fallback="error")
x = torch.randn(3)
torch.testing.assert_close(f(x), x.exp() + 1)
"""
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, CUVIL_CACHE_DIR=str(root)))
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    assert {root / "cpu-kernels", root / "cpu-programs"} <= set(folders)
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for f in root.rglob("*"):
        if f.is_file():
            assert not f.stat().st_mode & 0o022, f  # nothing others can write
