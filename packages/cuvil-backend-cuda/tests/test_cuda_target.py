"""The ``cuda`` target without a GPU: kernels in Triton's interpreter, PTX for sm_90.

Golden Triton sources (regenerate after a deliberate generator change, reviewing
the diff)::

    TRITON_INTERPRET=1 .nox/tests_cuda/bin/pytest packages/cuvil-backend-cuda/tests/test_cuda_target.py --update-golden
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.errors import CompileError
from cuvil.testing import golden
from cuvil.testing.kernels import KERNEL_CASES, softmax_dropout
from cuvil_runtime.registry import discover

pytestmark = pytest.mark.usefixtures("interpreter")

GOLDEN = Path(__file__).parent / "golden"
UPDATE_CMD = "TRITON_INTERPRET=1 pytest packages/cuvil-backend-cuda/tests/test_cuda_target.py --update-golden"


def executable(cf: Any) -> Any:
    art = cf.artifacts[-1]
    assert art.target == "cuda", art.reason
    return art.executable


GOLDEN_CASES = KERNEL_CASES


def check_golden(path: Path, text: str, update: bool) -> None:
    golden.check_golden(path, text, update=update, update_cmd=UPDATE_CMD)


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_triton_one_kernel_two_sizes(name, request):
    """Each case is one fused kernel whose text is golden, matches eager at two batch
    sizes with one compile, and compiles to PTX for sm_90."""
    fn, make = GOLDEN_CASES[name]
    cf = cu.compile(fn, target="cuda", fallback="error")
    for n in (3, 5):
        args = make(n)
        torch.testing.assert_close(cf(*args), fn(*args))
    assert cf.stats.compiles == 1
    ex = executable(cf)
    assert ex.report.kernels == 1 and ex.report.externs == 0, ex.stages["tensor_ir"]
    (texts,) = ex.kernel_texts.values()
    check_golden(
        GOLDEN / f"{name}.triton", texts["triton"], request.config.getoption("--update-golden", default=False)
    )
    assert ".target sm_90" in texts["ptx"]
    assert "tl.constexpr" in texts["triton"] and "s_" in texts["triton"]  # sizes are arguments


def test_no_stale_golden_files():
    stale = sorted(p.name for p in GOLDEN.glob("*.triton") if p.stem not in GOLDEN_CASES)
    assert not stale, f"golden files without a case: {stale}"


def test_audit_has_triton_and_ptx(tmp_path):
    x = torch.randn(4, 32)
    hashes = cu.audit(softmax_dropout, x, target="cuda", out_dir=tmp_path)
    # (then "mlir" where torch-mlir is installed)
    assert list(hashes)[:5] == ["graph_ir", "tensor_ir", "triton", "ptx", "wrapper"]
    assert "@triton.jit" in (tmp_path / "triton.txt").read_text()
    assert ".target sm_90" in (tmp_path / "ptx.txt").read_text()
    # deterministic: a second audit in a fresh compile gives the same hashes
    assert cu.audit(softmax_dropout, x, target="cuda") == hashes


@pytest.mark.parametrize("n", [4100, 9000])
def test_rows_longer_than_one_tile(n):
    """Rows past LaunchPolicy.one_tile_max take the looped variant; softmax, layer norm
    and a max-reduction with NaN still match eager."""

    def f(x, w, b):
        return (
            torch.softmax(x, -1),
            F.layer_norm(x, (n,), w, b),
            x.amax(-1),
            x.var(-1),
            torch.logsumexp(x, -1),
        )

    x = torch.randn(3, n) * 3 + 50  # an offset: a running mean in float32 would drift
    x[1, 7] = float("nan")
    args = (x, torch.randn(n), torch.randn(n))
    cf = cu.compile(f, target="cuda", fallback="error")
    torch.testing.assert_close(cf(*args), f(*args), equal_nan=True)
    # one pass for softmax's max and sum (online), one for mean and variance (Welford)
    source = cf.artifacts[-1].executable.stages["triton"]
    assert "accm" in source and "cu.welford_combine" in source


def test_strided_transposed_and_broadcast_inputs():
    def f(x, y, z):
        return (x.t() * y + z).relu().sum(-1, keepdim=True) * x.t()

    cf = cu.compile(f, target="cuda", fallback="error")
    for n in (3, 6):
        args = (torch.randn(7, n), torch.randn(n, 1), torch.randn(7))
        torch.testing.assert_close(cf(*args), f(*args))
    assert cf.stats.compiles == 1


def test_integer_division_by_zero_raises_as_eager():
    def f(x, y):
        return x // y

    x = torch.tensor([4, 5, -7])
    y = torch.tensor([2, -3, 2])
    cf = cu.compile(f, target="cuda", fallback="error")
    torch.testing.assert_close(cf(x, y), f(x, y))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # eager's
        f(x, torch.tensor([1, 0, 1]))
    with pytest.raises(ZeroDivisionError):  # the runner's, as on cpu
        cf(x, torch.tensor([1, 0, 1]))


def test_dropout_random_numbers_match_the_cpu_target():
    """rand is Philox on both targets: the same seed gives the same mask."""

    def f(x):
        return F.dropout(x, p=0.5, training=True)

    x = torch.randn(64, 33)
    on_cuda = cu.compile(f, target="cuda", fallback="error")
    on_cpu = cu.compile(f, target="cpu", fallback="error")
    torch.manual_seed(7)
    a = on_cuda(x)
    torch.manual_seed(7)
    b = on_cpu(x)
    assert torch.equal(a, b)
    assert 0.3 < (a == 0).float().mean() < 0.7


def test_control_flow_and_externs():
    def f(x, w):
        y = x @ w
        if y.sum() > 0:
            y = torch.softmax(y, -1)
        else:
            y = y * 2
        return y

    cf = cu.compile(f, target="cuda", fallback="error")
    w = torch.randn(8, 8)
    for s in (1.0, -1.0):
        x = torch.randn(4, 8).abs() * s
        torch.testing.assert_close(cf(x, w), f(x, w))


def test_options_are_checked():
    cu.compile(softmax_dropout, target="cuda", cuda_graphs=False)(torch.randn(2, 4))
    with pytest.raises(TypeError, match="cuda_graph"):
        cu.compile(softmax_dropout, target="cuda", cuda_graph=False)
    with pytest.raises(TypeError, match="cpu"):
        cu.compile(softmax_dropout, target="cpu", cuda_graphs=False)


def test_autotune_cache(tmp_path, monkeypatch):
    """The autotuner measures once per kernel and size bucket and keeps the winner on disk."""
    from cuvil_backend_cuda.target import CudaTarget
    from cuvil_ir.tensor_ir.lower import lower
    from cuvil_runtime.pipeline import compile_program
    from cuvil_runtime.target import CompileOptions

    monkeypatch.setenv("CUVIL_CUDA_AUTOTUNE", "1")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path))
    cf = cu.compile(softmax_dropout, target="reference")
    x = torch.randn(6, 40)
    cf(x)
    graph = cf.graphs[0]
    del lower
    first = CudaTarget()
    first.root = tmp_path
    out = compile_program(first, graph, CompileOptions(), tmp_path / "programs")(x)
    torch.testing.assert_close(out[0], softmax_dropout(x))
    tuner = first.tuner()
    assert tuner is not None and tuner.measured > 0
    table = json.loads(tuner.path.read_text())
    assert len(table) == 1
    second = CudaTarget()
    second.root = tmp_path
    compile_program(second, graph, CompileOptions(), tmp_path / "programs")(x)
    assert second.tuner().measured == 0  # type: ignore[union-attr]


def test_backends_lists_cuda():
    info = {b.name: b for b in discover()}
    assert info["cuda"].available, info["cuda"].reason


def test_unavailable_without_interpreter_says_why():
    """Without TRITON_INTERPRET on a CPU-only torch, cuda is unavailable, with the fix."""
    code = (
        "import cuvil as cu, torch\n"
        "from cuvil_runtime.registry import discover\n"
        "b = {x.name: x for x in discover()}['cuda']\n"
        "print(b.available, b.reason)\n"
        "try:\n"
        "    cu.compile(lambda x: x + 1, target='cuda')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.startswith("False"), out
    assert "CPU-only build" in out and "TRITON_INTERPRET=1" in out


def test_cuda_tensor_required_outside_interpreter_mode_message():
    """Under the interpreter the target takes CPU tensors; a meta tensor is refused by name."""
    cf = cu.compile(lambda x: x + 1, target="cuda", fallback="error")
    with pytest.raises(CompileError, match="argument 'x'"):
        cf(torch.empty(3, device="meta"))


def test_a_custom_op_fuses_into_its_neighbours_kernel():
    """``cu.custom_op``'s decomposition is inlined: a softmax chain around it is one kernel."""

    @cu.custom_op("cuda_test::scaled_gelu")
    def scaled_gelu(x, *, alpha=1.0):
        return F.gelu(x) * alpha

    def chain(x, b):
        return torch.softmax(scaled_gelu(x + b, alpha=0.5), dim=-1)

    cf = cu.compile(chain, target="cuda", fallback="error")
    for n in (3, 6):
        x, b = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(cf(x, b), chain(x, b))
    assert "cuda_test::scaled_gelu(" in cf.graphs[0].text
    report = executable(cf).report
    assert (report.kernels, report.externs) == (1, 0)


def test_a_native_triton_lowering_is_its_own_helper():
    @cu.custom_op("cuda_test::softsign", lower={"cuda": "x / (k + tl.abs(x))"})
    def softsign(x, *, k=1.0):
        return x / (k + x.abs())

    def chain(x):
        return torch.softmax(softsign(x, k=2.0), dim=-1)

    cf = cu.compile(chain, target="cuda", fallback="error")
    x = torch.randn(5, 12)
    torch.testing.assert_close(cf(x), chain(x))
    (texts,) = executable(cf).kernel_texts.values()
    assert "def native_cuda_test__softsign__f32(x, k):" in texts["triton"]
    assert ".target sm_90" in texts["ptx"]  # the helper compiles to PTX with the kernel
