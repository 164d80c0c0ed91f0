"""Ahead-of-time artifacts on the ``cpu`` target: ``cu.save`` then ``cu.load``, compared
with eager on several sizes; a fresh process with the source deleted and no C compiler;
damaged, foreign and untrusted artifacts refused with clear errors."""

from __future__ import annotations

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

torch.manual_seed(0)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 8)
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> dict[str, torch.Tensor]:
        h = self.l2(torch.relu(self.l1(x))) * scale + self.shift
        return {"probs": torch.softmax(h, -1), "top": h.amax(-1)}


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(root))
    return root


def _close(got: object, want: object) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for k in want:
            _close(got[k], want[k])
        return
    assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_module_round_trip_serves_every_batch(tmp_path: Path, cache: Path) -> None:
    m = Mlp().eval()
    path = cu.save(m, tmp_path / "mlp.cuvil", torch.randn(4, 16))
    f = cu.load(path)
    for b in (1, 4, 13):
        x = torch.randn(b, 16)
        _close(f(x), m(x))
        _close(f.submit(x).result(), m(x))
    z = zipfile.ZipFile(path)
    manifest = json.loads(z.read("manifest.json"))
    assert manifest["target"] == "cpu" and manifest["weights"] == "saved"
    # every member's data is 64-byte aligned in the file: tensors are used in place
    for info in z.infolist():
        with open(path, "rb") as f:
            f.seek(info.header_offset + 26)
            n, e = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        assert (info.header_offset + 30 + n + e) % 64 == 0, info.filename
    assert manifest["requires"]["isa"] in ("avx512", "avx2", "portable")


@torch.no_grad()
def test_python_values_and_sizes_are_checked(tmp_path: Path, cache: Path) -> None:
    f = cu.load(cu.save(Mlp().eval(), tmp_path / "mlp.cuvil", torch.randn(2, 16), 3.0))
    with pytest.raises(TypeError, match="saved for float 3.0, got 2.0"):
        f(torch.randn(2, 16), 2.0)
    with pytest.raises(TypeError, match="structure differs"):
        f(torch.randn(2, 16))  # saved with scale passed: a call without it is another call
    with pytest.raises(ValueError, match=r"size guard Eq\(x_1, 16\) failed"):
        f(torch.randn(2, 12), 3.0)
    with pytest.raises(TypeError, match="expected a float32 tensor of rank 2"):
        f(torch.randn(2, 16, dtype=torch.float64), 3.0)
    with pytest.raises(TypeError, match="mlp.cuvil"):
        f(torch.randn(2, 16), 3.0, 4)


@torch.no_grad()
def test_weights_bound_at_load(tmp_path: Path, cache: Path) -> None:
    m = Mlp().eval()
    path = cu.save(m, tmp_path / "slim.cuvil", torch.randn(3, 16), weights=False)
    with pytest.raises(TypeError, match="module=m"):
        cu.load(path)
    other = Mlp().eval()  # another set of weights, same shapes
    f = cu.load(path, module=other)
    x = torch.randn(5, 16)
    _close(f(x), other(x))
    other.l1.weight.mul_(0.5)  # read on every call: an in-place update is seen
    _close(f(x), other(x))
    wrong = Mlp().eval()
    wrong.l2 = torch.nn.Linear(32, 4)
    with pytest.raises(TypeError, match="l2.weight"):
        cu.load(path, module=wrong)
    assert os.path.getsize(path) < os.path.getsize(cu.save(m, tmp_path / "fat.cuvil", torch.randn(3, 16)))


SCALE = 3.0
OFFSET = torch.arange(6, dtype=torch.float32)


def _frozen(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # control flow on a tensor: compiled as a region
        return x * SCALE + OFFSET
    return x - OFFSET


@torch.no_grad()
def test_control_flow_and_frozen_globals(tmp_path: Path, cache: Path) -> None:
    f = cu.load(cu.save(_frozen, tmp_path / "cf.cuvil", torch.ones(2, 6)))
    for x in (torch.ones(3, 6), -torch.ones(1, 6)):
        _close(f(x), _frozen(x))
    from cuvil.aot import inspect_artifact

    info = inspect_artifact(tmp_path / "cf.cuvil")
    assert "global 'SCALE' = 3.0" in info["call"]["frozen"]


def test_saving_is_deterministic(tmp_path: Path, cache: Path) -> None:
    x = torch.randn(2, 6)
    a = cu.save(_frozen, tmp_path / "a.cuvil", x).read_bytes()
    b = cu.save(_frozen, tmp_path / "b.cuvil", x).read_bytes()
    assert a == b


_SOURCE = textwrap.dedent(
    """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = torch.nn.functional.gelu(self.proj(x))
            return y.softmax(-1) * (y.shape[0] + 1)
    """
)


def test_fresh_process_without_source_or_compiler(tmp_path: Path, cache: Path) -> None:
    """What the issue's "done" asks: the defining file deleted, no C compiler on PATH."""
    src = tmp_path / "netdef.py"
    src.write_text(_SOURCE)
    art = tmp_path / "net.cuvil"
    want = tmp_path / "want.pt"
    save = (
        "import sys, torch, cuvil as cu; sys.path.insert(0, sys.argv[1]); import netdef;"
        "m = netdef.Net().eval(); cu.save(m, sys.argv[2], torch.randn(2, 8));"
        "x = torch.arange(40.).reshape(5, 8) / 10;"
        "torch.save({'x': x, 'y': m(x).detach()}, sys.argv[3])"
    )
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", save, str(tmp_path), str(art), str(want)], check=True, env=env)
    src.unlink()
    load = (
        "import sys, shutil, torch, cuvil as cu; assert shutil.which('cc') is None;"
        "f = cu.load(sys.argv[1]); ref = torch.load(sys.argv[2]);"
        "torch.testing.assert_close(f(ref['x']), ref['y']); print('ok', 'torch._dynamo' in sys.modules)"
    )
    env.update(PATH=str(tmp_path / "empty-bin"), CC="/nonexistent/cc")
    out = subprocess.run(
        [sys.executable, "-c", load, str(art), str(want)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "False"]  # no capture: torch._dynamo never imported


# -- damaged, foreign and untrusted artifacts ----------------------------------------------


@pytest.fixture()
def artifact(tmp_path: Path, cache: Path) -> Path:
    return cu.save(_frozen, tmp_path / "good.cuvil", torch.ones(2, 6))


def _rewrite(path: Path, out: Path, change: dict[str, bytes] | None = None, manifest: object = None) -> Path:
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members.update(change or {})
    if manifest is not None:
        members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    return out


def _manifest(path: Path) -> dict[str, object]:
    return json.loads(zipfile.ZipFile(path).read("manifest.json"))  # type: ignore[no-any-return]


def test_a_flipped_byte_in_a_kernel_is_refused(artifact: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(artifact) as z:
        kernel = next(n for n in z.namelist() if n.startswith("files/"))
        blob = bytearray(z.read(kernel))
    blob[len(blob) // 2] ^= 0xFF
    bad = _rewrite(artifact, tmp_path / "bad.cuvil", {kernel: bytes(blob)})
    with pytest.raises(ArtifactError, match=f"{kernel} does not match its sha256"):
        cu.load(bad)


def test_truncated_and_foreign_files(artifact: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.cuvil"
    cut.write_bytes(artifact.read_bytes()[:500])
    with pytest.raises(ArtifactError, match="not a zip file"):
        cu.load(cut)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        cu.load(other)
    extra = _rewrite(artifact, tmp_path / "extra.cuvil", {"files/evil.so": b"\x7fELF"})
    with pytest.raises(ArtifactError, match="not in the manifest"):
        cu.load(extra)


def test_another_isa_torch_version_or_target(artifact: Path, tmp_path: Path) -> None:
    m = _manifest(artifact)
    isa = json.loads(json.dumps(m))
    isa["requires"]["cpu_flags"].append("avx10_9")  # a feature no CPU has
    with pytest.raises(ArtifactError, match="this CPU lacks avx10_9"):
        cu.load(_rewrite(artifact, tmp_path / "isa.cuvil", manifest=isa))
    machine = json.loads(json.dumps(m))
    machine["requires"]["machine"] = "riscv64"
    with pytest.raises(ArtifactError, match="built for riscv64"):
        cu.load(_rewrite(artifact, tmp_path / "arch.cuvil", manifest=machine))
    old = json.loads(json.dumps(m))
    old["versions"]["torch"] = "1.13.1"
    with pytest.raises(ArtifactError, match="saved with torch 1.13.1"):
        cu.load(_rewrite(artifact, tmp_path / "torch.cuvil", manifest=old))
    target = json.loads(json.dumps(m))
    target["target"] = "tpu9"
    with pytest.raises(ArtifactError, match="target 'tpu9'"):
        cu.load(_rewrite(artifact, tmp_path / "target.cuvil", manifest=target))
    future = json.loads(json.dumps(m))
    future["version"] = 99
    with pytest.raises(ArtifactError, match="version 99"):
        cu.load(_rewrite(artifact, tmp_path / "future.cuvil", manifest=future))


def test_an_artifact_others_can_write_is_not_loaded(artifact: Path) -> None:
    artifact.chmod(0o666)
    with pytest.raises(ArtifactError, match="writable by others"):
        cu.load(artifact)
    artifact.chmod(0o644)
    cu.load(artifact)


def test_cli_save_and_inspect(tmp_path: Path, cache: Path) -> None:
    src = tmp_path / "clidef.py"
    src.write_text(_SOURCE)
    out = tmp_path / "cli.cuvil"
    run = [sys.executable, "-m", "cuvil.cli"]
    env = dict(os.environ)
    saved = subprocess.run(
        [*run, "aot", "save", f"{src}:Net", "--args-spec", "f32[3,8]", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert saved.returncode == 0, saved.stderr
    shown = subprocess.run([*run, "aot", "inspect", str(out)], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "runs here: yes" in shown.stdout and "every sha256 verified" in shown.stdout
    assert "argument x: float32 tensor of rank 2 on cpu (any sizes)" in shown.stdout
    info = subprocess.run([*run, "cache", "info"], env=env, capture_output=True, text=True)
    assert "cpu-kernels" in info.stdout and "cpu-programs" in info.stdout


def test_cache_verify_finds_and_deletes_damage(tmp_path: Path, cache: Path) -> None:
    from cuvil_runtime import cache_admin

    code = "import torch, cuvil as cu; cu.compile(lambda x: (x * 2).exp(), target='cpu', fallback='error')(torch.ones(3))"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))  # CUVIL_CACHE_DIR=cache
    infos = cache_admin.verify(cache)
    assert {i.path.name for i in infos} >= {"cpu-kernels", "cpu-programs"}
    assert all(not i.damaged for i in infos)
    assert all(
        i.entries for i in infos if i.path.name.startswith("cpu-")
    )  # (-c code has no file: no "calls")
    so = next((cache / "cpu-kernels").rglob("*.so"))
    so.write_bytes(so.read_bytes()[:-8])
    program = next(
        p for p in (cache / "cpu-programs").rglob("*") if p.is_file() and not p.name.startswith(".")
    )
    program.write_bytes(program.read_bytes() + b"x")
    damaged = {d for i in cache_admin.verify(cache) for d in i.damaged}
    assert damaged == {so, program}
    cache_admin.verify(cache, delete=True)
    assert not so.exists() and not program.exists()
    assert all(not i.damaged for i in cache_admin.verify(cache))
    (cache / "unrelated.txt").write_text("keep me")
    assert cache_admin.clear(cache) > 0
    assert cache_admin.stores(cache) == [] and (cache / "unrelated.txt").exists()


class ConvAttention(torch.nn.Module):
    """conv -> BN -> relu (the epilogue rewrite) and hand-written attention (the attention
    rewrite): an artifact gets the same rewrites as a compile."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))  # (b, 8, 4, 4)
        q = h.flatten(2).transpose(1, 2)  # (b, 16, 8): 16 queries of 8
        att = torch.softmax(q @ q.transpose(-1, -2) / 8**0.5, dim=-1)
        return att @ q


@torch.no_grad()
def test_artifacts_get_the_targets_rewrites(tmp_path: Path, cache: Path) -> None:
    m = ConvAttention().eval()
    f = cu.load(cu.save(m, tmp_path / "ca.cuvil", torch.randn(2, 3, 4, 4)))
    for b in (1, 3):
        x = torch.randn(b, 3, 4, 4)
        _close(f(x), m(x))
    lowered = f.executable.stages["tensor_ir"]
    assert "cpu_conv_epilogue" in lowered and "cpu_attention" in lowered, lowered


def _two_tensors(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ y, dim=-1) + x.sum()


@torch.no_grad()
def test_a_flat_call_is_checked_as_fully(tmp_path: Path, cache: Path) -> None:
    # a call of plain positional tensors skips binding and flattening, not the checks
    f = cu.load(cu.save(_two_tensors, tmp_path / "flat.cuvil", torch.randn(3, 4), torch.randn(4, 5)))
    for m in (2, 7):
        x, y = torch.randn(m, 4), torch.randn(4, 5)
        _close(f(x, y), _two_tensors(x, y))
    with pytest.raises(TypeError, match="structure differs"):
        f(x, y=y)  # a keyword: the full path, which serves only the call as saved
    with pytest.raises(TypeError, match="argument y: expected a float32 tensor of rank 2"):
        f(torch.randn(2, 4), torch.randn(4, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="argument x: expected a float32 tensor of rank 2"):
        f(torch.randn(2, 4, 1), torch.randn(4, 5))
    with pytest.raises(ValueError, match="serves only sizes it was compiled for"):
        f(torch.randn(2, 3), torch.randn(4, 5))  # inner sizes disagree
    with pytest.raises(TypeError):
        f(torch.randn(2, 4))  # one argument short: the full path's binding error
    with torch.enable_grad(), pytest.raises(TypeError, match="requires grad"):
        f(torch.randn(2, 4, requires_grad=True), torch.randn(4, 5))
    # results carry no autograd history, and grad mode is restored
    with torch.enable_grad():
        out = f(torch.randn(2, 4), torch.randn(4, 5, requires_grad=False))
        assert torch.is_grad_enabled() and out.grad_fn is None
