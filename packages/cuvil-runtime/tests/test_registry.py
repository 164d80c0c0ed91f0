"""Target discovery through real entry points.

Each test writes synthetic installed distributions (a ``*.dist-info`` folder with
METADATA and entry_points.txt, beside the plugin module) into a temporary folder
and puts it on ``sys.path``: importlib.metadata then finds them exactly as it
finds a pip-installed backend.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from cuvil_runtime import registry
from cuvil_runtime.target import CompileOptions

#: a plugin module; {name}, {priority}, {devices}, {install} are filled per test
PLUGIN = """
from cuvil_runtime.target import GRAPH_STAGE, BackendSpec, Capabilities

class _Target:
    name = {name!r}
    capabilities = Capabilities(devices=frozenset({devices!r}))
    stages = (GRAPH_STAGE,)

    def hash(self):
        return "synthetic"

    def compile(self, graph, options):
        from cuvil_runtime.executor import Interpreter
        return Interpreter(graph)

BACKEND = BackendSpec(
    name={name!r},
    description="synthetic target {name}",
    factory=_Target,
    install={install!r},
    priority={priority},
    capabilities=_Target.capabilities,
    check={check},
)
"""

MakeDist = Callable[..., str]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    registry.reset()
    yield
    registry.reset()


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDist]:
    """``make_dist(dist, target, source=...)`` installs a one-target distribution; returns its module name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules: list[str] = []

    def make(
        dist: str,
        target: str,
        *,
        source: str | None = None,
        priority: int = 0,
        devices: tuple[str, ...] = ("cpu",),
        install: str | None = None,
        check: str = "lambda: None",
    ) -> str:
        module = f"_cuvil_test_plugin_{uuid.uuid4().hex[:12]}"
        modules.append(module)
        if source is None:
            source = PLUGIN.format(
                name=target, priority=priority, devices=set(devices), install=install, check=check
            )
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[cuvil.backends]\n{target} = {module}:BACKEND\n")
        return module

    yield make
    for m in modules:
        sys.modules.pop(m, None)


def test_builtin_reference_target_is_discovered_like_any_plugin() -> None:
    [info] = [i for i in registry.discover() if i.name == "reference"]
    assert info.available and info.reason is None
    assert info.distribution == "cuvil-runtime"
    assert info.install is None  # built in


def test_discovery_lists_an_installed_plugin_and_imports_it_lazily(make_dist: MakeDist) -> None:
    module = make_dist("cuvil-test-fast", "fast", priority=7, install="pip install cuvil-test-fast")
    assert "fast" in registry.REGISTRY.names()
    assert module not in sys.modules, "reading entry-point metadata must not import the plugin"

    infos = {i.name: i for i in registry.discover()}
    assert list(infos) == sorted(infos)
    fast = infos["fast"]
    assert fast.available and fast.reason is None
    assert fast.distribution == "cuvil-test-fast"
    assert fast.install == "pip install cuvil-test-fast"
    assert fast.priority == 7
    assert fast.description == "synthetic target fast"
    assert module in sys.modules


def test_get_target_builds_once_and_compiles(make_dist: MakeDist) -> None:
    from cuvil_ir import DType, Graph, Node, TensorType, Value, symbol

    make_dist("cuvil-test-fast", "fast")
    target = registry.get_target("fast")
    assert registry.get_target("fast") is target

    B = symbol("B")
    x = Value("x", TensorType(DType.f32, (B,)))
    y = Value("0", TensorType(DType.f32, (B,)))
    graph = Graph("double", (x,), (Node("add", (x, x), (y,)),), (y,))
    exe = target.compile(graph, CompileOptions())
    t = torch.arange(5.0)
    torch.testing.assert_close(exe(t)[0], t + t)


def test_broken_plugin_is_listed_unavailable_and_raises_only_when_requested(make_dist: MakeDist) -> None:
    make_dist(
        "cuvil-test-broken", "broken", source="raise ImportError('libfoo.so: cannot open shared object')\n"
    )
    make_dist("cuvil-test-fine", "fine")

    infos = {i.name: i for i in registry.discover()}  # must not raise
    broken = infos["broken"]
    assert not broken.available
    assert broken.distribution == "cuvil-test-broken"
    assert "ImportError" in broken.reason and "libfoo.so" in broken.reason
    assert infos["fine"].available
    assert registry.get_target("fine").name == "fine"

    with pytest.raises(registry.TargetUnavailableError, match="libfoo.so") as err:
        registry.get_target("broken")
    assert err.value.name == "broken"
    assert isinstance(err.value.__cause__, ImportError)


def test_entry_point_that_is_not_a_backend_spec_is_unavailable(make_dist: MakeDist) -> None:
    make_dist("cuvil-test-odd", "odd", source="BACKEND = 'not a spec'\n")
    [odd] = [i for i in registry.discover() if i.name == "odd"]
    assert not odd.available
    assert "not a cuvil_runtime.target.BackendSpec" in odd.reason
    with pytest.raises(registry.TargetUnavailableError, match="BackendSpec"):
        registry.get_target("odd")


def test_failed_check_reports_reason_not_a_reinstall(make_dist: MakeDist) -> None:
    """The distribution is installed: its check's reason says what to do, and the
    error does not tell the user to pip install what they have (it used to)."""
    make_dist(
        "cuvil-test-gpu",
        "gpu",
        devices=("cuda",),
        install="pip install 'cuvil[cuda]'",
        check="lambda: 'no CUDA device is visible'",
    )
    [gpu] = [i for i in registry.discover() if i.name == "gpu"]
    assert not gpu.available and gpu.reason == "no CUDA device is visible"
    with pytest.raises(registry.TargetUnavailableError) as err:
        registry.get_target("gpu")
    assert err.value.reason == "no CUDA device is visible"
    assert err.value.install == "pip install 'cuvil[cuda]'"
    assert str(err.value) == "target 'gpu' is unavailable: no CUDA device is visible"


def test_duplicate_names_from_two_distributions_are_an_error(make_dist: MakeDist) -> None:
    make_dist("cuvil-test-one", "twin")
    make_dist("cuvil-test-two", "twin")
    with pytest.raises(registry.DuplicateTargetError) as err:
        registry.discover()
    assert "cuvil-test-one" in str(err.value) and "cuvil-test-two" in str(err.value)
    assert "'twin'" in str(err.value)
    with pytest.raises(registry.DuplicateTargetError):
        registry.get_target("reference")


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(
        registry.UnknownTargetError, match=r"unknown target 'cpux'.*known targets: .*reference"
    ):
        registry.get_target("cpux")


def test_default_target_picks_the_highest_priority_available_target(make_dist: MakeDist) -> None:
    # priorities above every real backend's (cpu is 10), so installed backends do not interfere
    make_dist("cuvil-test-slow", "slow", priority=500)
    make_dist("cuvil-test-fast", "fast", priority=1000)
    make_dist("cuvil-test-gpu", "gpu", priority=10000, devices=("cuda",))
    make_dist("cuvil-test-best", "best", priority=5000, check="lambda: 'no compiler'")
    assert registry.default_target("cpu") == "fast"  # best is unavailable, gpu runs elsewhere
    assert registry.default_target("cuda") == "gpu"
    assert registry.default_target("meta") == "reference"
    with pytest.raises(registry.UnknownTargetError, match="no available target runs on device type 'xpu'"):
        registry.default_target("xpu")


def test_default_target_breaks_priority_ties_by_name(make_dist: MakeDist) -> None:
    make_dist("cuvil-test-b", "bravo", priority=300)
    make_dist("cuvil-test-a", "alpha", priority=300)
    assert registry.default_target("cpu") == "alpha"


def test_explicit_entry_points_replace_the_scan() -> None:
    reg = registry.Registry([EntryPoint("ref", "cuvil_runtime.reference:BACKEND", registry.GROUP)])
    [info] = reg.discover()
    # The spec calls itself "reference": a renamed entry point is caught, not silently used.
    assert info.name == "ref" and not info.available
    assert "resolves to the spec of target 'reference'" in info.reason
    reg = registry.Registry([EntryPoint("reference", "cuvil_runtime.reference:BACKEND", registry.GROUP)])
    assert reg.get_target("reference").name == "reference"


def test_a_target_that_breaks_the_contract_is_unavailable_with_the_reason(make_dist: MakeDist) -> None:
    source = PLUGIN.format(
        name="nostages", priority=0, devices={"cpu"}, install=None, check="lambda: None"
    ).replace("    stages = (GRAPH_STAGE,)\n", "")
    make_dist("cuvil-test-nostages", "nostages", source=source)
    with pytest.raises(registry.TargetUnavailableError, match="no 'stages'"):
        registry.get_target("nostages")


def test_stages_must_start_with_the_graph(make_dist: MakeDist) -> None:
    source = PLUGIN.format(
        name="backwards", priority=0, devices={"cpu"}, install=None, check="lambda: None"
    ).replace("stages = (GRAPH_STAGE,)", "stages = (Stage('code', 'x'), GRAPH_STAGE)")
    source = source.replace("import GRAPH_STAGE,", "import GRAPH_STAGE, Stage,")
    make_dist("cuvil-test-backwards", "backwards", source=source)
    with pytest.raises(registry.TargetUnavailableError, match="graph_ir stage first"):
        registry.get_target("backwards")


def test_discover_shows_each_targets_stages_in_order() -> None:
    infos = {i.name: i for i in registry.discover()}
    assert infos["reference"].stages == ("graph_ir",)
    if "cpu" in infos:
        assert infos["cpu"].stages == ("graph_ir", "tensor_ir", "loop_ir", "c", "wrapper")
