"""The ``ascend`` target without an NPU: kernels in Triton's interpreter, Ascend's rules checked.

Golden Triton-Ascend sources (regenerate after a deliberate generator change,
reviewing the diff)::

    CUVIL_ASCEND_SIM=1 TRITON_INTERPRET=1 pytest packages/cuvil-backend-ascend/tests/test_ascend_target.py --update-golden
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.errors import CompileError
from cuvil.testing import golden
from cuvil.testing.kernels import KERNEL_CASES, bias_gelu, softmax_dropout
from cuvil_backend_ascend.launch import AscendLauncher
from cuvil_backend_ascend.policy import POLICY, AscendPolicy
from cuvil_backend_ascend.rules import OPTIONS, LaunchRuleError, check_launch, needed_bytes
from cuvil_backend_ascend.target import AscendTarget
from cuvil_runtime.registry import discover, get_target
from cuvil_runtime.target import CompileOptions

pytestmark = pytest.mark.usefixtures("simulation")

GOLDEN = Path(__file__).parent / "golden"
UPDATE_CMD = (
    "CUVIL_ASCEND_SIM=1 TRITON_INTERPRET=1 pytest packages/cuvil-backend-ascend/tests/test_ascend_target.py "
    "--update-golden"
)


GOLDEN_CASES = KERNEL_CASES


def executable(cf: Any) -> Any:
    art = cf.artifacts[-1]
    assert art.target == "ascend", art.reason
    return art.executable


def launchers(exe: Any) -> list[AscendLauncher]:
    """The launcher of every kernel, recording its launches from now on."""
    out = []
    for launch in exe._runner.kernels.values():
        assert isinstance(launch.fn, AscendLauncher)
        launch.fn.launches = []
        out.append(launch.fn)
    return out


def captured_graph(fn: Any, *args: Any) -> Any:
    cf = cu.compile(fn, target="reference", fallback="error")
    cf(*args)
    return cf.graphs[0]


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_triton_ascend_one_kernel_two_sizes(name, request):
    """Each case is one fused kernel whose text is golden (a loop over the program's
    blocks, no warps), matching eager at two batch sizes with one compile."""
    fn, make = GOLDEN_CASES[name]
    cf = cu.compile(fn, target="ascend", fallback="error")
    for n in (3, 5):
        args = make(n)
        torch.testing.assert_close(cf(*args), fn(*args))
    assert cf.stats.compiles == 1
    ex = executable(cf)
    assert ex.report.kernels == 1 and ex.report.externs == 0, ex.stages["tensor_ir"]
    (texts,) = ex.kernel_texts.values()
    update = request.config.getoption("--update-golden", default=False)
    golden.check_golden(GOLDEN / f"{name}.triton", texts["triton"], update=update, update_cmd=UPDATE_CMD)
    source = texts["triton"]
    assert "tl.num_programs(0)" in source and "num_warps" not in source
    assert "welford" not in source and "float64" not in source


def test_no_stale_golden_files():
    stale = sorted(p.name for p in GOLDEN.glob("*.triton") if p.stem not in GOLDEN_CASES)
    assert not stale, f"golden files without a case: {stale}"


@pytest.mark.parametrize("n", [7, 300, 5000])
def test_every_launch_keeps_the_rules(n):
    """Softmax (rows, one tile or looped), layer norm with a long row, and a pointwise
    chain: every launch is a 1-D grid of at most one program per core, with only
    block sizes as options, aligned rows and tiles inside the unified-buffer share."""

    def f(x, w, b):
        return torch.softmax(x, -1), F.layer_norm(x, (n,), w, b), (x * 2 + 1).sigmoid()

    x = torch.randn(6, n) * 3 + 20  # an offset: the two-pass variance must not drift
    args = (x, torch.randn(n), torch.randn(n))
    cf = cu.compile(f, target="ascend", fallback="error")
    cf(*args)  # compile
    ex = executable(cf)
    seen = launchers(ex)
    torch.testing.assert_close(cf(*args), f(*args))
    target = get_target("ascend")
    for launcher in seen:
        assert launcher.launches, launcher.tk.name
        for grid, config in launcher.launches:
            assert len(grid) == 1 and 1 <= grid[0] <= target.cores
            assert set(config) <= OPTIONS
            assert needed_bytes(launcher.tk, config, POLICY) <= POLICY.budget
            row = config.get("RBLOCK", config["XBLOCK"]) * launcher.tk.narrow_bytes
            assert row % POLICY.align_bytes == 0
    if n == 5000:  # 5000-wide rows do not fit one tile: the looped variant ran
        assert any(not c.get("ONE_TILE", True) for lch in seen for _, c in lch.launches)


def test_programs_loop_over_their_blocks():
    """With 2 cores and small blocks, each of the 2 programs handles many blocks."""
    policy = AscendPolicy(cores=2, max_block=64)
    x = torch.randn(1000)
    graph = captured_graph(lambda x: x * 3 - 1, x)
    target = AscendTarget(policy)
    assert target.cores == 2
    exe = target.compile(graph, CompileOptions())
    (launcher,) = launchers(exe)
    (out,) = exe(x)
    torch.testing.assert_close(out, x * 3 - 1)
    ((grid, config),) = launcher.launches
    assert grid == (2,) and config == {"XBLOCK": 64}  # 16 blocks, 8 per program


def test_a_kernel_that_cannot_fit_the_unified_buffer_is_a_compile_error():
    tiny = AscendPolicy(ub_bytes=256)
    graph = captured_graph(softmax_dropout, torch.randn(4, 64))
    with pytest.raises(LaunchRuleError, match="unified buffer"):
        AscendTarget(tiny).compile(graph, CompileOptions())


def test_too_many_cores_is_a_compile_error():
    graph = captured_graph(bias_gelu, torch.randn(2, 3, 4), torch.randn(4))
    with pytest.raises(LaunchRuleError, match="65535"):
        AscendTarget(AscendPolicy(cores=70000)).compile(graph, CompileOptions())


def test_rule_violations_reach_the_user_as_compile_errors(monkeypatch):
    """A target's refusal is a CompileError naming the target and the rule, not an internal error."""
    monkeypatch.setattr(get_target("ascend"), "policy", AscendPolicy(ub_bytes=256))

    def rowwise(x):  # a graph of its own: no compiled executable to reuse
        return torch.softmax(x * 3, -1)

    cf = cu.compile(rowwise, target="ascend", fallback="error")
    with pytest.raises(CompileError, match="target 'ascend': kernel k0: .* unified buffer") as info:
        cf(torch.randn(4, 64))
    assert "internal error" not in str(info.value)


@pytest.mark.parametrize(
    "config, grid, message",
    [
        ({"XBLOCK": 64, "num_warps": 4}, (1,), "no warps"),
        ({"XBLOCK": 64, "num_stages": 2}, (1,), "num_stages"),
        ({"XBLOCK": 64}, (1, 2), "1-D grids"),
        ({"XBLOCK": 64}, (65536,), "1 to 65535"),
        ({"XBLOCK": 4}, (1,), "32 bytes"),
        ({"XBLOCK": 48}, (1,), "power of two"),
        ({"XBLOCK": 1 << 16}, (1,), "unified buffer"),
    ],
)
def test_check_launch_refuses_each_rule(config, grid, message):
    graph = captured_graph(lambda x: x + 1, torch.randn(8))
    target = AscendTarget()
    exe = target.compile(graph, CompileOptions())
    (launcher,) = launchers(exe)
    with pytest.raises(LaunchRuleError, match=message):
        check_launch(launcher.tk, config, grid, POLICY)


def test_float64_stays_out_of_kernels():
    """The vector unit has no float64 arithmetic: float64 ops are torch calls."""

    def f(x):
        return torch.exp(x) * 2 + 1

    x = torch.randn(5, 3, dtype=torch.float64)
    cf = cu.compile(f, target="ascend", fallback="error")
    torch.testing.assert_close(cf(x), f(x))
    assert executable(cf).report.kernels == 0


def test_control_flow_externs_and_int_division():
    def f(x, w, k):
        y = x @ w
        if y.sum() > 0:
            y = torch.softmax(y, -1)
        else:
            y = y * 2
        return y, k // 3, k % 3

    cf = cu.compile(f, target="ascend", fallback="error")
    w = torch.randn(8, 8)
    k = torch.tensor([7, -7, 9, 0])
    for s in (1.0, -1.0):
        x = torch.randn(4, 8).abs() * s
        torch.testing.assert_close(cf(x, w, k), f(x, w, k))
    with pytest.raises(ZeroDivisionError):
        cu.compile(lambda a, b: a // b, target="ascend", fallback="error")(k, torch.tensor([1, 0, 1, 1]))


def test_dropout_random_numbers_match_the_cpu_target():
    def f(x):
        return F.dropout(x, p=0.5, training=True)

    x = torch.randn(64, 33)
    on_ascend = cu.compile(f, target="ascend", fallback="error")
    on_cpu = cu.compile(f, target="cpu", fallback="error")
    torch.manual_seed(7)
    a = on_ascend(x)
    torch.manual_seed(7)
    b = on_cpu(x)
    assert torch.equal(a, b)


def test_audit_has_the_triton_stage(tmp_path):
    x = torch.randn(4, 32)
    hashes = cu.audit(softmax_dropout, x, target="ascend", out_dir=tmp_path)
    # upstream triton here: no ttir/linalg stages (those need triton-ascend)
    assert list(hashes)[:4] == ["graph_ir", "tensor_ir", "triton", "wrapper"]
    assert "tl.num_programs(0)" in (tmp_path / "triton.txt").read_text()
    assert cu.audit(softmax_dropout, x, target="ascend") == hashes


def test_backends_lists_ascend():
    info = {b.name: b for b in discover()}["ascend"]
    assert info.available, info.reason
    assert info.distribution == "cuvil-backend-ascend"
    assert info.stages == ("graph_ir", "tensor_ir", "triton", "wrapper")


def test_yolox_head_compiles_once_for_every_size(yolox_head):
    head = yolox_head
    cf = cu.compile(head, target="ascend", opt_level=2, fallback="error")
    with torch.no_grad():
        for b, h, w in ((1, 8, 8), (2, 6, 10)):
            x = torch.randn(b, 16, h, w)
            torch.testing.assert_close(cf(x), head(x), rtol=1e-4, atol=1e-4)
    assert cf.stats.compiles == 1
    assert executable(cf).report.kernels >= 1


def test_a_custom_op_fuses_into_its_neighbours_kernel():
    """``cu.custom_op``'s decomposition is inlined: a softmax chain around it is one kernel."""

    @cu.custom_op("ascend_test::scaled_gelu")
    def scaled_gelu(x, *, alpha=1.0):
        return F.gelu(x) * alpha

    def chain(x, b):
        return torch.softmax(scaled_gelu(x + b, alpha=0.5), dim=-1)

    cf = cu.compile(chain, target="ascend", fallback="error")
    for n in (3, 6):
        x, b = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(cf(x, b), chain(x, b))
    assert "ascend_test::scaled_gelu(" in cf.graphs[0].text
    assert (executable(cf).report.kernels, executable(cf).report.externs) == (1, 0)


def test_a_native_triton_lowering_is_its_own_helper():
    @cu.custom_op("ascend_test::softsign", lower={"ascend": "x / (k + tl.abs(x))"})
    def softsign(x, *, k=1.0):
        return x / (k + x.abs())

    def chain(x):
        return torch.softmax(softsign(x, k=2.0), dim=-1)

    cf = cu.compile(chain, target="ascend", fallback="error")
    x = torch.randn(5, 12)
    torch.testing.assert_close(cf(x), chain(x))
    (texts,) = executable(cf).kernel_texts.values()
    assert "def native_ascend_test__softsign__f32(x, k):" in texts["triton"]
