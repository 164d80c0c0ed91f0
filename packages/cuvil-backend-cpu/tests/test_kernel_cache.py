"""The on-disk kernel cache, with the real compiler: hits, damage, races, errors, parallel builds."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import hmac
import subprocess
import sys
import time

import pytest

from cuvil_backend_cpu import toolchain as tc_mod
from cuvil_backend_cpu.kernel_cache import KernelBuildError, KernelCache
from cuvil_backend_cpu.progress import CompileProgress, progress_enabled
from cuvil_backend_cpu.toolchain import ToolchainError, find_toolchain

ADD = "#include <stdint.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }\n"


def scaled(i: int) -> str:
    return f"#include <stdint.h>\nint64_t scaled_{i}(int64_t a) {{ return a * {i + 2}; }}\n"


@pytest.fixture(autouse=True)
def _quiet(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_PROGRESS", "0")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def cache(tmp_path) -> KernelCache:
    return KernelCache(root=tmp_path / "kernels")


def call_add(cache: KernelCache, path) -> int:
    fn = cache.load(path).add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    return fn(2**40, 3)


def files(cache: KernelCache) -> list[str]:
    return sorted(
        p.name
        for p in cache.root.rglob("*")
        if p.is_file() and not p.name.endswith(".lock") and p.name != ".cuvil-key"
    )


def signature(cache: KernelCache, path) -> str:
    return hmac.new((cache.root / ".cuvil-key").read_bytes(), path.read_bytes(), hashlib.sha256).hexdigest()


def test_build_load_call_and_hit(cache):
    path = cache.build(ADD, "add")
    key = cache.key(ADD)
    assert path == cache.root / key[:2] / f"{key}.so"
    assert (path.with_suffix(".c")).read_text() == ADD
    assert path.with_suffix(".hmac").read_text().strip() == signature(cache, path)
    assert files(cache) == sorted([f"{key}.so", f"{key}.c", f"{key}.hmac"])  # no temporaries left
    assert (cache.stats.hits, cache.stats.misses, cache.stats.builds) == (0, 1, 1)
    assert call_add(cache, path) == 2**40 + 3

    assert cache.build(ADD) == path
    assert (cache.stats.hits, cache.stats.misses, cache.stats.builds) == (1, 1, 1)
    assert cache.load(path) is cache.load(path)
    # Another cache object (another process, in effect) over the same root hits too.
    other = KernelCache(root=cache.root)
    assert other.build(ADD) == path and other.stats.builds == 0


def test_key_is_deterministic(cache):
    assert cache.key(ADD) == KernelCache(root=cache.root).key(ADD)
    assert cache.key(ADD) != cache.key(ADD + "\n")
    flagged = dataclasses.replace(cache.toolchain, flags=(*cache.toolchain.flags, "-g"))
    assert KernelCache(flagged, root=cache.root).key(ADD) != cache.key(ADD)


def test_truncated_so_is_rebuilt(cache):
    path = cache.build(ADD)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    assert cache.build(ADD) == path
    assert (cache.stats.misses, cache.stats.builds) == (2, 2)
    assert path.stat().st_size == size
    assert call_add(cache, path) == 2**40 + 3


@pytest.mark.parametrize("damage", ["wrong digest", "garbage", "missing"])
def test_bad_sidecar_is_rebuilt(cache, damage):
    path = cache.build(ADD)
    sidecar = path.with_suffix(".hmac")
    if damage == "missing":
        sidecar.unlink()
    else:
        sidecar.write_bytes(b"0" * 64 if damage == "wrong digest" else b"\xff\xfe\x00")
    assert cache.build(ADD) == path
    assert (cache.stats.hits, cache.stats.misses, cache.stats.builds) == (0, 2, 2)
    assert sidecar.read_text().strip() == signature(cache, path)
    assert cache.build(ADD) == path and cache.stats.hits == 1


def test_compile_error(cache):
    source = "int broken(int x) { return x +; }\n"
    with pytest.raises(KernelBuildError) as info:
        cache.build(source, "broken")
    err = info.value
    key = cache.key(source)
    message = str(err)
    assert "'broken'" in message and "error" in message  # names the kernel and quotes the compiler
    assert cache.toolchain.cc in message and str(err.source_path) in message
    assert err.command[0] == cache.toolchain.cc and err.returncode != 0 and "error" in err.output
    assert err.source_path.read_text() == source  # kept, so the command can be re-run by hand
    assert files(cache) == [f"{key}.c"]  # no .so, no sidecar, no temporaries
    assert cache.stats.builds == 0


def test_error_output_is_trimmed(cache):
    source = "".join(f"int f{i}(void) {{ return undeclared_{i}; }}\n" for i in range(200))
    with pytest.raises(KernelBuildError) as info:
        cache.build(source, "noisy")
    assert "more lines)" in str(info.value)
    assert len(str(info.value).splitlines()) < 70


_RACER = """
import os, sys, time
from pathlib import Path
from cuvil_backend_cpu.kernel_cache import KernelCache
root, me, source = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cache = KernelCache(root=root)
(root.parent / f"ready-{me}").touch()
deadline = time.monotonic() + 60
while not (root.parent / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.002)
lib = cache.load(cache.build(source, "add"))
lib.add.restype = __import__("ctypes").c_int64
print(lib.add(2, 3), cache.stats.builds)
"""


def test_two_processes_build_the_same_kernel(tmp_path, cache):
    root = cache.root
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(root), str(i), ADD], stdout=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    (tmp_path / "go").touch()  # both start building at once
    outputs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [out[0] for out in outputs] == ["5", "5"]
    assert sum(int(out[1]) for out in outputs) == 1  # the second waited and found the first's entry
    key = cache.key(ADD)
    assert files(cache) == sorted([f"{key}.so", f"{key}.c", f"{key}.hmac"])
    assert call_add(cache, cache.build(ADD)) == 2**40 + 3 and cache.stats.hits == 1


def test_build_all_in_parallel_and_in_order(cache):
    done = cache.build(scaled(0))
    sources = [(f"scaled_{i}", scaled(i)) for i in range(6)] + [("again", scaled(3))]
    paths = cache.build_all(sources)
    assert paths[0] == done and paths[6] == paths[3]
    assert paths == [cache.paths(cache.key(source))[0] for _, source in sources]
    assert cache.stats.builds == 6  # scaled(0) before, then 1..5 once each (the repeat compiles once)
    assert (cache.stats.hits, cache.stats.misses) == (2, 6)
    for i, path in enumerate(paths[:6]):
        fn = getattr(cache.load(path), f"scaled_{i}")
        fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_int64]
        assert fn(10) == 10 * (i + 2)
    assert cache.build_all(sources) == paths and cache.stats.builds == 6
    assert cache.build_all([]) == []


def test_build_all_raises_the_compile_error(cache):
    bad = "int nope( {\n"
    sources = [("good_a", scaled(1)), ("bad", bad), ("good_b", scaled(2))]
    with pytest.raises(KernelBuildError, match="'bad'"):
        cache.build_all(sources)
    assert not cache.paths(cache.key(bad))[0].exists()
    assert not [p for p in cache.root.rglob("*.tmp")]


def test_missing_compiler_fails_at_construction(tmp_path, monkeypatch):
    monkeypatch.setattr(tc_mod, "_toolchain", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ToolchainError, match="no C compiler found"):
        KernelCache(root=tmp_path / "kernels")
    monkeypatch.setattr(tc_mod, "_toolchain", None)
    monkeypatch.delenv("CC")
    assert find_toolchain() is not None  # restored environment: found again


def test_progress_disabled_by_env(cache, monkeypatch):
    assert not progress_enabled() and not progress_enabled(True)
    with CompileProgress("compiling", 3, delay=0.0) as bar:
        time.sleep(0.05)
        bar.advance(3)
    assert not bar.shown and bar.completed == 3
    assert len(cache.build_all([("a", scaled(7)), ("b", scaled(8))], progress=None)) == 2


def test_progress_shows_only_after_the_delay(monkeypatch):
    monkeypatch.setenv("CUVIL_PROGRESS", "1")
    with CompileProgress("fast", 2, delay=10.0) as bar:
        bar.advance(2)
    assert not bar.shown  # finished before the delay: nothing drawn
    with CompileProgress("slow", 2, delay=0.0) as bar:
        deadline = time.monotonic() + 5
        while not bar.shown and time.monotonic() < deadline:
            time.sleep(0.01)
        bar.advance(2)
    assert bar.shown
    monkeypatch.delenv("CUVIL_PROGRESS")
    assert not progress_enabled(False)
