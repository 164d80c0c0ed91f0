"""The example op library, installed as a third party would: its ops are found through
the ``cuvil.ops`` entry point, fuse with their neighbours and match eager."""

import subprocess
import sys

import pytest
import torch

import cuvil as cu
from cuvil.plugins import op_infos


def _available(name):
    return any(b.name == name and b.available for b in cu.backends())


def test_the_entry_point_declares_the_ops_without_an_import():
    """A fresh process that never imports the library still finds its ops."""
    code = "from cuvil.cli import main; raise SystemExit(main(['ops']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in ("example::swish_gate", "example::rms_scale"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert "custom" in line and "cuvil-ops-example" in line, line


def test_eager_and_torch_ops_forms():
    from cuvil_ops_example import rms_scale, swish_gate

    x, g = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(swish_gate(x, g, beta=2.0), x * torch.sigmoid(2.0 * g))
    torch.testing.assert_close(torch.ops.example.rms_scale(x), rms_scale(x))


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_a_block_using_both_ops_fuses_and_matches_eager(target):
    if not _available(target):
        pytest.skip(f"the {target} target is not installed here")
    from cuvil_ops_example import rms_scale, swish_gate

    def block(x, w, g):
        return torch.softmax(swish_gate(rms_scale(x) * w, g, beta=0.5), dim=-1)

    cf = cu.compile(block, target=target, fallback="error")
    for n in (2, 5):
        x, w, g = torch.randn(n, 32), torch.randn(32), torch.randn(n, 32)
        torch.testing.assert_close(cf(x, w, g), block(x, w, g))
    assert cf.stats.compiles == 1
    text = cf.graphs[0].text
    assert "example::rms_scale(" in text and "example::swish_gate(" in text
    if target == "cpu":
        exe = cf.artifacts[-1].executable
        assert exe.report.externs == 0 and exe.report.kernels <= 2, exe.report
        # swish_gate is its own C expression there, fused with the rest
        assert "cu_native_example__swish_gate__f32(" in exe.stages["c"]


def test_op_infos_say_how_targets_lower_them():
    infos = {i.name: i for i in op_infos()}
    assert infos["example::swish_gate"].lowering == "region; native on cpu"
    assert infos["example::rms_scale"].lowering == "region"
