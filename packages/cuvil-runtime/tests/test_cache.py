"""Compile caches: the in-process LRU and the on-disk artifact store."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest
import torch

from cuvil_ir import DType, Graph, Node, TensorType, Value, symbol
from cuvil_runtime.cache import CompileCache, DiskCache, default_cache_dir
from cuvil_runtime.executor import Interpreter
from cuvil_runtime.reference import ReferenceTarget
from cuvil_runtime.target import CompileOptions, Executable

# -- DiskCache -----------------------------------------------------------------


def test_put_then_get(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    assert cache.get("kernel-a") is None
    path = cache.put("kernel-a", b"\x7fELF...")
    assert path == cache.path("kernel-a") and path.is_relative_to(tmp_path)
    assert cache.get("kernel-a") == b"\x7fELF..."
    assert "kernel-a" in cache and "kernel-b" not in cache
    cache.put("kernel-a", b"v2")
    assert cache.get("kernel-a") == b"v2"
    cache.put("empty", b"")
    assert cache.get("empty") == b""
    # Nothing but the artifacts is left behind (no temporary files).
    stored = [p.name for p in tmp_path.rglob("*") if p.is_file() and p.name != ".cuvil-key"]
    assert sorted(stored) == sorted([cache.path("kernel-a").name, cache.path("empty").name])


def test_truncated_file_is_a_miss_and_is_removed(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    path = cache.put("k", b"0123456789" * 100)
    path.write_bytes(path.read_bytes()[:-7])
    assert cache.get("k") is None
    assert not path.exists()
    cache.put("k", b"fresh")
    assert cache.get("k") == b"fresh"


@pytest.mark.parametrize("damage", ["flip", "empty", "header-only", "foreign"])
def test_damaged_file_is_never_returned(tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path)
    path = cache.put("k", b"payload" * 10)
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-1] ^= 0xFF
    elif damage == "empty":
        blob = bytearray()
    elif damage == "header-only":
        blob = blob[:20]
    else:
        blob = bytearray(b"payload" * 10)  # the raw bytes without a header
    path.write_bytes(bytes(blob))
    assert cache.get("k") is None
    assert not path.exists()


def test_default_root_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert DiskCache().root == tmp_path / "c"
    monkeypatch.delenv("CUVIL_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "cuvil"


_ROUNDS = 40
_SIZE = 256 * 1024


def _writer(root: str, fill: int) -> None:
    cache = DiskCache(root)
    for _ in range(_ROUNDS):
        cache.put("shared-key", bytes([fill]) * _SIZE)


def test_concurrent_writers_from_two_processes(tmp_path: Path) -> None:
    # fork: the writer is a function of this test module, which importlib mode
    # does not make importable by name in a spawned child.
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), fill)) for fill in (0xAA, 0x55)]
    for p in procs:
        p.start()
    cache = DiskCache(tmp_path)
    seen = set()
    while any(p.is_alive() for p in procs):
        data = cache.get("shared-key")
        if data is not None:  # a reader sees one writer's whole payload, never a mix
            assert len(data) == _SIZE and data.count(data[:1]) == _SIZE
            seen.add(data[0])
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    final = cache.get("shared-key")
    assert final is not None and final in (b"\xaa" * _SIZE, b"\x55" * _SIZE)
    assert seen <= {0xAA, 0x55}
    stored = [p.name for p in tmp_path.rglob("*") if p.is_file() and p.name != ".cuvil-key"]
    assert stored == [cache.path("shared-key").name]


# -- CompileCache ----------------------------------------------------------------


class CountingTarget(ReferenceTarget):
    """The reference target, counting how often it really compiles."""

    def __init__(self) -> None:
        self.compiles = 0

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        self.compiles += 1
        return super().compile(graph, options)


def _graph(op: str) -> Graph:
    B = symbol("B")
    x = Value("x", TensorType(DType.f32, (B,)))
    y = Value("y", TensorType(DType.f32, (B,)))
    return Graph(op, (x,), (Node(op, (x,), (y,)),), (y,))


class SlowTarget(CountingTarget):
    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        time.sleep(0.05)  # long enough that every thread misses before the first finishes
        return super().compile(graph, options)


def test_compile_cache_compiles_a_key_once_when_threads_miss_together() -> None:
    cache, target = CompileCache(), SlowTarget()
    graphs = [_graph("abs"), _graph("neg")]
    barrier = threading.Barrier(8)
    results: list[Executable] = []

    def work(i: int) -> None:
        barrier.wait()
        results.append(cache.get_or_compile(graphs[i % 2], target, CompileOptions()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.compiles == 2  # one per key (up to 8 before)
    assert len({id(r) for r in results}) == 2 and not cache._pending


def test_compile_cache_reuses_by_graph_target_and_options() -> None:
    cache, target = CompileCache(), CountingTarget()
    exe = cache.get_or_compile(_graph("neg"), target, CompileOptions())
    assert isinstance(exe, Interpreter)
    assert cache.get_or_compile(_graph("neg"), target, CompileOptions()) is exe  # equal graph, new object
    assert target.compiles == 1
    cache.get_or_compile(_graph("neg"), target, CompileOptions(opt_level=0))
    cache.get_or_compile(_graph("abs"), target, CompileOptions())
    assert target.compiles == 3 and len(cache) == 3
    t = torch.tensor([-1.0, 2.0])
    torch.testing.assert_close(exe(t)[0], -t)


def test_compile_cache_evicts_the_least_recently_used() -> None:
    cache, target = CompileCache(maxsize=2), CountingTarget()
    neg, abs_, relu = _graph("neg"), _graph("abs"), _graph("relu")
    cache.get_or_compile(neg, target, CompileOptions())
    cache.get_or_compile(abs_, target, CompileOptions())
    cache.get_or_compile(neg, target, CompileOptions())  # neg is now the most recent
    cache.get_or_compile(relu, target, CompileOptions())  # evicts abs
    assert len(cache) == 2
    assert cache.get(neg.hash, "reference", CompileOptions()) is not None
    assert cache.get(abs_.hash, "reference", CompileOptions()) is None
    with pytest.raises(ValueError, match="maxsize"):
        CompileCache(maxsize=0)
