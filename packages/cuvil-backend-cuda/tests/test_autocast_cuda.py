"""CUDA autocast captured on the ``cuda`` target, without a GPU ([Note: autocast captured]
in cuvil/autocast.py): the capture with CUDA's casting rules (:data:`cuvil.autocast.CUDA_POLICY`)
runs on the CPU tensors that stand for CUDA ones in Triton's interpreter, and is compared with
eager under CUDA autocast computed on CPU (:mod:`cuvil.testing.cuda_autocast`: torch's own
AutocastCUDA kernels, on tensors that say they are on CUDA). The half kernels between the
casts run in the interpreter. On a GPU, ``tests/test_gpu.py::test_cuda_autocast_is_captured``
(marked ``device``) compares a real ``torch.autocast("cuda")`` region with eager."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu
from cuvil import autocast, warm
from cuvil.testing.conformance import TOLERANCES
from cuvil.testing.cuda_autocast import autocast_block, autocast_block_args, eager_under_cuda_autocast

pytestmark = pytest.mark.usefixtures("interpreter")


@pytest.fixture
def cuda_rules_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autocast on the interpreter's CPU tensors captured with CUDA's rules (a graph
    captured so is what one on CUDA tensors would be, device aside)."""
    monkeypatch.setitem(autocast.POLICIES, "cpu", autocast.CUDA_POLICY)
    monkeypatch.setitem(autocast.BANNED, "cpu", autocast.BANNED["cuda"])
    monkeypatch.setenv(warm.ENV, "0")


@pytest.mark.parametrize(
    "dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.slow)], ids=str
)
@pytest.mark.usefixtures("cuda_rules_on_cpu")
def test_cuda_autocast_rules_match_eager(dtype: torch.dtype) -> None:
    f = cu.compile(autocast_block, target="cuda", fallback="error")
    for n in (3, 6):
        with torch.autocast("cpu", dtype=dtype):
            got = f(*autocast_block_args(n))
        want = eager_under_cuda_autocast(autocast_block, autocast_block_args(n), dtype)
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.dtype == b.dtype, (k, a.dtype, b.dtype)
            torch.testing.assert_close(a, b, **TOLERANCES[dtype], msg=lambda m, k=k: f"output {k}: {m}")
    assert f.stats.compiles == 1
    exe = f.artifacts[-1].executable
    assert exe.report.kernels >= 3  # the half and float32 math between the casts is fused
    store = "cu.to_bf16(" if dtype == torch.bfloat16 else ".to(tl.float16)"
    assert any(store in t["triton"] for t in exe.kernel_texts.values())  # a kernel stores the half type
