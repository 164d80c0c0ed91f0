"""``cu.compile`` enforces what a target declares it can run (``Capabilities``): a target
without control flow or extern calls never receives a graph that needs them; the user
gets a located CompileError, or the eager call with fallback="eager"."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import cuvil as cu
from cuvil_runtime import registry

PLUGIN = """
from cuvil_runtime.target import GRAPH_STAGE, BackendSpec, Capabilities

CAPS = Capabilities(devices=frozenset({"cpu"}), control_flow=False, extern_calls=False)


class _Target:
    name = "plain"
    capabilities = CAPS
    stages = (GRAPH_STAGE,)
    compiled = []

    def hash(self):
        return "plain"

    def compile(self, graph, options):
        from cuvil_runtime.executor import Interpreter

        for n in graph.nodes:
            assert not n.regions and n.op != "extern", "the frontend must not send this graph"
        _Target.compiled.append(graph.name)
        return Interpreter(graph)


BACKEND = BackendSpec(name="plain", description="no control flow, no externs", factory=_Target, capabilities=CAPS)
"""


@pytest.fixture
def plain_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = "_cuvil_test_plain_target"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "cuvil_test_plain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cuvil-test-plain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[cuvil.backends]\nplain = {module}:BACKEND\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.reset()
    yield sys.modules.get(module) or __import__(module)
    registry.reset()
    sys.modules.pop(module, None)


def branchy(x):
    if x.sum() > 0:  # a tensor condition: an `if` region in the graph
        return x * 2
    return x - 1


def opaque(x):
    return torch.linalg.matrix_exp(x)  # no Cuvil op: an extern call


def test_a_graph_within_the_capabilities_compiles(plain_target):
    f = cu.compile(lambda x: torch.relu(x) + 1, target="plain", fallback="error")
    x = torch.randn(3, 3)
    torch.testing.assert_close(f(x), torch.relu(x) + 1)
    assert plain_target._Target.compiled


def test_control_flow_on_a_target_without_it_is_a_located_error(plain_target):
    f = cu.compile(branchy, target="plain", fallback="error")
    with pytest.raises(cu.CompileError, match="cannot run control flow") as err:
        f(torch.randn(3))
    assert f"{Path(__file__).name}:" in str(err.value) and "x.sum() > 0" in str(err.value)
    assert not plain_target._Target.compiled


def test_extern_calls_on_a_target_without_them_fall_back_to_eager(plain_target):
    f = cu.compile(opaque, target="plain")  # fallback="eager" is the default
    x = torch.randn(3, 3) * 0.1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.testing.assert_close(f(x), opaque(x))
    assert any("cannot run extern torch calls" in str(m.message) for m in w)
    assert f.stats.fallbacks == 1 and not plain_target._Target.compiled
