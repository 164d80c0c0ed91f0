"""The first call in a fresh process (docs/runtime.md, "Warm starts"): a compiled function
with a warm cache and a ``cu.load``-ed artifact give eager's results, take the warm path
(no capture, no lowering), and see weights that differ from the ones the cache or the
artifact was made with; a tensor member that does not match its hash is refused even
though it is verified on another thread.

Each case runs in child processes (``sys.executable``) over one cache folder, as a
server restarting would.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import cuvil as cu
from cuvil.aot import ArtifactError
from cuvil_backend_cpu.aot import library_present
from cuvil_runtime import gc_pause

#: a conv -> BatchNorm -> ReLU chain with a residual add (the folded, prepacked conv path),
#: a pooling and a linear: ResNet's first-call work in small
NET = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)) + y)
            return self.fc(y.mean((2, 3)))


    def build(seed):
        torch.manual_seed(seed)
        m = Net()
        for bn in (m.bn1, m.bn2):  # statistics a real network has, not the init's 0 and 1
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
        return m.eval()
    """
)

CHILD = textwrap.dedent(
    """
    import gc, json, sys
    import torch
    import cuvil as cu
    from warmnet import build

    mode, seed, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    m = build(seed)
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = m(x)
        if mode == "save":
            cu.save(cu.compile(m, target="cpu", fallback="error"), path, x)
            print(json.dumps({}))
            sys.exit(0)
        f = cu.load(path) if mode == "load" else cu.compile(m, target="cpu", fallback="error")
        got = f(x)
        lowered = "cuvil_ir.tensor_ir.lower" in sys.modules
        from cuvil_backend_cpu import externs

        packed = len(externs._FOLDED)
        # an in-place update between calls is seen (the packed weight is keyed by version)
        m.conv1.weight.mul_(1.5)
        # (a loaded artifact runs its own saved weights: unchanged)
        again, want2 = f(x), (want if mode == "load" else m(x))
    print(json.dumps({
        "err": float((got - want).abs().max()),
        "err2": float((again - want2).abs().max()),
        "warm_starts": getattr(getattr(f, "stats", None), "warm_starts", None),
        "dynamo": "torch._dynamo" in sys.modules,
        "lowered": lowered,
        "packed": packed,
        "gc_enabled": gc.isenabled(),
    }))
    """
)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "warmnet.py").write_text(NET)
    (tmp_path / "child.py").write_text(CHILD)
    return tmp_path


def _run(project: Path, mode: str, seed: int = 0, path: str = "") -> dict[str, object]:
    env = dict(os.environ, CUVIL_CACHE_DIR=str(project / "cache"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(project), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(project / "child.py"), mode, str(seed), path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=project,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_warm_compiled_function_takes_the_warm_path_and_sees_other_weights(project: Path) -> None:
    cold = _run(project, "compile", seed=0)
    assert cold["warm_starts"] == 0 and cold["lowered"] and cold["dynamo"]
    assert cold["err"] < 1e-4 and cold["err2"] < 1e-4
    warm = _run(project, "compile", seed=0)
    # no capture (torch._dynamo is capture's), no lowering: the stored variant and program
    assert warm["warm_starts"] == 1 and not warm["lowered"] and not warm["dynamo"]
    assert warm["err"] < 1e-4 and warm["err2"] < 1e-4
    assert warm["packed"] == 2 and warm["gc_enabled"]
    # other weights and statistics (same shapes): the same warm variant, this process's values
    other = _run(project, "compile", seed=1)
    assert other["warm_starts"] == 1 and not other["lowered"]
    assert other["err"] < 1e-4 and other["err2"] < 1e-4


def test_a_loaded_artifact_runs_without_lowering(project: Path) -> None:
    art = str(project / "net.cuvil")
    _run(project, "save", seed=0, path=art)
    loaded = _run(project, "load", seed=0, path=art)
    assert not loaded["lowered"] and not loaded["dynamo"]
    assert loaded["err"] < 1e-4 and loaded["err2"] < 1e-4 and loaded["packed"] == 2
    assert loaded["gc_enabled"]
    # the artifact holds its saved weights: a module built with other weights differs from it
    other = _run(project, "load", seed=1, path=art)
    assert other["err"] > 1e-3


def test_a_damaged_tensor_is_refused_though_hashed_on_a_thread(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = project / "net.cuvil"
    _run(project, "save", seed=0, path=str(art))
    with zipfile.ZipFile(art) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = max((n for n in members if n.startswith("tensors/")), key=lambda n: len(members[n]))
    blob = bytearray(members[name])
    blob[len(blob) // 2] ^= 0x01  # one bit of one weight
    members[name] = bytes(blob)
    bad = tmp_path / "bad.cuvil"
    with zipfile.ZipFile(bad, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(project / "cache"))
    with pytest.raises(ArtifactError, match=f"{name} does not match its sha256"):
        cu.load(bad)
    assert gc.isenabled()  # the window closed on the error too
    assert cu.load(art)(torch.randn(1, 3, 8, 8)).shape == (1, 5)


def test_gc_pause_nests_and_keeps_a_disabled_collector_off() -> None:
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()  # the process turned it off: it stays off
    finally:
        gc.enable()


def test_library_present() -> None:
    assert library_present("c") and library_present("m")
    assert library_present("gomp")  # torch's own copy, mapped in this process
    assert not library_present("cuvil-no-such-library")


def test_tensor_ir_lower_is_the_function_whatever_is_imported_first() -> None:
    """``cuvil_ir.tensor_ir`` exports ``lower`` lazily; importing the submodule ``lower``
    first (which makes it the package's attribute) must not turn ``tensor_ir.lower`` into
    a module, and a warm path imports neither."""
    code = textwrap.dedent(
        """
        import sys, types
        import cuvil_ir.tensor_ir as T
        assert "cuvil_ir.tensor_ir.lower" not in sys.modules
        import cuvil_ir.tensor_ir.lower as sub
        from cuvil_ir.tensor_ir import lower
        assert isinstance(sys.modules["cuvil_ir.tensor_ir.lower"], types.ModuleType)
        assert callable(lower) and lower is T.lower is sys.modules["cuvil_ir.tensor_ir.lower"].lower
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
