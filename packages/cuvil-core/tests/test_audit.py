"""``cu.audit`` and ``cuvil audit``: every stage's hash, the texts behind them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import cuvil as cu
from cuvil.cli import main, parse_args_spec
from cuvil_runtime.registry import get_target


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


needs_cpu = pytest.mark.skipif(not _available("cpu"), reason="the cpu target is not installed here")


def head(x, w):
    return torch.softmax(x.mean((2, 3)) @ w, dim=-1)


@needs_cpu
def test_audit_hashes_every_stage_of_a_cpu_compile(tmp_path: Path) -> None:
    x, w = torch.randn(2, 3, 8, 8), torch.randn(3, 5)
    hashes = cu.audit(head, x, w, target="cpu", out_dir=tmp_path)
    # the stages the cpu target declares, in its order (then mlir when it can be emitted)
    declared = [s.name for s in get_target("cpu").stages]
    assert declared == ["graph_ir", "tensor_ir", "loop_ir", "c", "wrapper"]
    assert list(hashes)[:5] == declared and set(hashes) <= {*declared, "mlir"}
    assert all(len(h) == 64 for h in hashes.values())
    assert json.loads((tmp_path / "hashes.json").read_text()) == hashes
    texts = {p.stem: p.read_text() for p in tmp_path.glob("*.txt")}
    assert set(texts) == set(hashes)
    assert "softmax" in texts["graph_ir"] and "kernel" in texts["tensor_ir"] and "#pragma omp" in texts["c"]
    # the same program audited again (a new function object, a fresh compile) hashes alike
    assert cu.audit(head, x, w, target="cpu") == hashes
    # the graph hash is the one the compile caches key on
    compiled = cu.compile(head, target="cpu")
    compiled(x, w)
    assert compiled.graphs[0].hash == hashes["graph_ir"]


def test_audit_on_the_reference_target_has_the_graph_stage() -> None:
    hashes = cu.audit(head, torch.randn(2, 3, 4, 4), torch.randn(3, 5), target="reference")
    assert "graph_ir" in hashes and "c" not in hashes


@needs_cpu
def test_one_token_changes_the_graph_hash_and_what_follows() -> None:
    def f1(x):
        return torch.relu(x * 2.0) + 1.0

    def f2(x):
        return torch.relu(x * 2.0) - 1.0

    x = torch.randn(4, 4)
    a, b = cu.audit(f1, x, target="cpu"), cu.audit(f2, x, target="cpu")
    assert a["graph_ir"] != b["graph_ir"] and a["c"] != b["c"]


def test_args_spec() -> None:
    x, ids, flag, n, s = parse_args_spec("f32[2, 3], i64[4], bool[], 3, 0.5")
    assert x.shape == (2, 3) and x.dtype == torch.float32
    assert ids.dtype == torch.int64 and flag.shape == () and flag.dtype == torch.bool
    assert (n, s) == (3, 0.5)
    with pytest.raises(ValueError, match="unknown dtype 'q8'"):
        parse_args_spec("q8[2]")


def test_cli_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = tmp_path / "mymodel.py"
    mod.write_text(
        textwrap.dedent(
            """
            import torch

            def f(x, y):
                return torch.softmax(x @ y + 1.0, dim=-1)

            class Block(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = torch.nn.Linear(8, 4)

                def forward(self, x):
                    return torch.nn.functional.gelu(self.lin(x))
            """
        )
    )
    out = tmp_path / "audit"
    assert main(["audit", f"{mod}:f", "--args-spec", "f32[8,16], f32[16,4]", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    hashes = json.loads((out / "hashes.json").read_text())
    for name, h in hashes.items():
        assert f"{name}" in printed and h in printed
    assert main(["audit", f"{mod}:Block", "--args-spec", "f32[5,8]"]) == 0  # a module class is built
    assert main(["audit", f"{mod}:missing", "--args-spec", "f32[5,8]"]) == 2
    assert "has no attribute 'missing'" in capsys.readouterr().err
