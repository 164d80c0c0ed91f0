"""Cache faults recover (issue 26 item 11): a cache folder deleted while a process runs is
made again on the next write; one that stops taking writes (a full disk, a read-only
folder, a file in its place) is replaced by a private folder of the process with one
warning naming it and why; nothing stays broken for the rest of the process.

Every case is a real child process compiling real kernels with the system C compiler
into its own ``CUVIL_CACHE_DIR``, compared with eager. Before, each of them ended in
``internal error: FileNotFoundError ... .so`` (deleted), ``TargetUnavailableError``
for good (deleted before the cpu target was made) or ``OSError: No space left on
device`` on every compile (full), fully cached ones included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cuvil_backend_cpu")
pytest.importorskip("cuvil")

#: the child's preamble: three functions (each its own kernels), compiled with fallback="error"
#: and checked against eager; `run(fn)` prints nothing, raises on any difference
_PRELUDE = textwrap.dedent(
    """
    import os, shutil, subprocess, sys, warnings
    from pathlib import Path
    import torch
    import cuvil as cu
    warnings.simplefilter("always")
    ROOT = Path(os.environ["CUVIL_CACHE_DIR"])
    x = torch.randn(37)
    def f(x):
        return torch.relu(x) * 2
    def g(x):
        return torch.sigmoid(x) + 1
    def h(x):
        return torch.tanh(x) - 3
    def run(fn):
        c = cu.compile(fn, target="cpu", fallback="error")
        torch.testing.assert_close(c(x), fn(x))
        assert c.stats.fallbacks == 0, c.stats
        return c
    """
)


def _child(tmp_path: Path, body: str, cache: Path | None = None, wrap: list[str] | None = None) -> str:
    script = tmp_path / "child.py"
    script.write_text(_PRELUDE + _SHOW_WARNINGS + textwrap.dedent(body))
    env = {
        **os.environ,
        "CUVIL_CACHE_DIR": str(cache if cache is not None else tmp_path / "cache"),
        "CUVIL_PROGRESS": "0",
    }
    proc = subprocess.run(
        [*(wrap or []), sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _cache_warnings(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("WARNING ")]


_SHOW_WARNINGS = """
def show(w):
    for m in w:
        if m.category.__name__ == "UntrustedCacheWarning":
            print("WARNING", str(m.message).replace(chr(10), " "))
"""


def test_cache_cleared_by_another_process_is_made_again(tmp_path):
    out = _child(
        tmp_path,
        """
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            run(f)
            # `cuvil cache clear` from another process, while this one runs
            subprocess.run([sys.executable, "-m", "cuvil.cli", "cache", "clear"], check=True)
            assert not (ROOT / "cpu-kernels").exists()
            run(g)  # new kernels: built, and loaded from a fresh folder of loaded copies
            shutil.rmtree(ROOT)  # and the whole folder, as `rm -rf` would
            run(h)
            run(f)  # a new compile of the first function too
        show(w)
        kernels = ROOT / "cpu-kernels"
        print("made again:", kernels.is_dir() and any(kernels.rglob("*.so")), oct(kernels.stat().st_mode & 0o777))
        print("key:", (kernels / ".cuvil-key").is_file())
        """,
    )
    assert "made again: True 0o700" in out
    assert "key: True" in out
    assert _cache_warnings(out) == []  # nothing to warn about: the folder is used again


def test_cache_deleted_before_the_cpu_target_is_made(tmp_path):
    """The toolchain probe decides the kernel folder; deleting it then used to make the
    target's factory fail (its key could not be written) on every later compile."""
    out = _child(
        tmp_path,
        """
        from cuvil_backend_cpu.toolchain import find_toolchain
        find_toolchain()
        assert (ROOT / "cpu-kernels").is_dir()
        shutil.rmtree(ROOT)
        run(f)
        run(g)
        print("ok")
        """,
    )
    assert "ok" in out


def test_file_in_place_of_the_cache_falls_back_with_one_warning(tmp_path):
    """A folder that cannot be made again (a file where it was: what a write into a
    read-only or full cache also meets) is replaced by a private folder, warned about once."""
    out = _child(
        tmp_path,
        """
        run(f)
        shutil.rmtree(ROOT)
        ROOT.write_text("not a folder")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            run(g)
            run(h)
        show(w)
        from cuvil_runtime import trust
        used = trust.trusted_dir(ROOT / "cpu-kernels", "kernel cache")
        print("private:", oct(used.stat().st_mode & 0o777), used.stat().st_uid == os.geteuid())
        """,
    )
    warned = _cache_warnings(out)
    assert len(warned) == 1, out
    cache = tmp_path / "cache"
    assert str(cache) in warned[0] and "Not a directory" in warned[0] and "private folder" in warned[0]
    assert "private: 0o700 True" in out


def test_read_only_store_midway_falls_back_with_one_warning(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through any mode bits (the full-disk test covers root)")
    out = _child(
        tmp_path,
        """
        run(f)
        for store in ("cpu-kernels", "cpu-programs", "calls"):
            for d in [ROOT / store, *(p for p in (ROOT / store).rglob("*") if p.is_dir())]:
                os.chmod(d, 0o500)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            run(g)
            run(h)
        show(w)
        """,
    )
    warned = _cache_warnings(out)
    assert len(warned) == 1, out
    assert str(tmp_path / "cache") in warned[0] and "Permission denied" in warned[0]


def _tiny_filesystem() -> list[str] | None:
    """A command prefix that runs its command in a private mount namespace (where it may
    mount a tmpfs), or ``None`` when this host allows none."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else None
    if prefix is None:
        return None  # a user namespace would map /tmp's owner to nobody: no cache folder is trusted there
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def test_full_disk_falls_back_even_for_fully_cached_compiles(tmp_path):
    prefix = _tiny_filesystem()
    if prefix is None:
        pytest.skip("cannot mount a small tmpfs here (needs root and unshare)")
    disk = tmp_path / "disk"
    disk.mkdir(mode=0o700)
    cache = disk / "cache"
    # one shell in its own mount namespace: a 4 MiB tmpfs, a warm-up run, the disk filled, then the test
    script = tmp_path / "child.py"
    runner = tmp_path / "run.sh"
    runner.write_text(
        textwrap.dedent(
            f"""
            set -e
            mount -t tmpfs -o size=4m,mode=0700 tmpfs {disk}
            "$@" warm
            python_fill() {{ "$1" -c 'import sys
            with open(sys.argv[1], "wb") as fh:
                try:
                    while True: fh.write(bytes(65536)); fh.flush()
                except OSError as e: print("filled:", e.strerror)' {disk}/filler; }}
            python_fill "$1"
            "$@" full
            """
        )
    )
    script.write_text(
        _PRELUDE
        + _SHOW_WARNINGS
        + textwrap.dedent(
            """
            if sys.argv[1] == "warm":
                run(f)
                sys.exit()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                run(f)  # its program and kernels are all on the full disk (loading them needs a write)
                run(g)  # new kernels: nowhere on the full disk to build them
            show(w)
            """
        )
    )
    env = {**os.environ, "CUVIL_CACHE_DIR": str(cache), "CUVIL_PROGRESS": "0"}
    proc = subprocess.run(
        [*prefix, "sh", str(runner), sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "filled: No space left on device" in proc.stdout
    warned = _cache_warnings(proc.stdout)
    assert len(warned) == 1, proc.stdout
    assert str(cache) in warned[0] and "No space left on device" in warned[0]
