"""On a real NVIDIA GPU (marked ``device``: excluded from ``nox -s tests``; run with
``pytest packages/cuvil-backend-cuda/tests/test_gpu.py -m device`` on a GPU host
without ``TRITON_INTERPRET``): compiled kernels, autotuning and CUDA Graphs
against eager on CUDA tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def block(x, w, b, g):
    y = F.layer_norm(x, (x.shape[-1],), g, b)
    return torch.softmax(y @ w, -1) * 2 + F.gelu(y)


def args(n):
    d = 64
    return (
        torch.randn(n, 16, d, device="cuda"),
        torch.randn(d, d, device="cuda"),
        torch.randn(d, device="cuda"),
        torch.randn(d, device="cuda"),
    )


@pytest.mark.parametrize("graphs", [True, False])
def test_matches_eager_with_and_without_graphs(graphs):
    cf = cu.compile(block, target="cuda", fallback="error", cuda_graphs=graphs)
    for n in (1, 3, 3, 3, 8, 3):
        a = args(n)
        torch.testing.assert_close(cf(*a), block(*a), rtol=1e-4, atol=1e-4)
    assert cf.stats.compiles == 1
    exe = cf.artifacts[-1].executable
    if graphs:
        assert exe.captures >= 1 and exe.replays >= 1
    else:
        assert exe.replays == 0
        assert any("turned off" in n for n in cf.stats.notes)


def test_outputs_are_not_overwritten_by_the_next_replay():
    cf = cu.compile(lambda x: x * 2 + 1, target="cuda", fallback="error")
    xs = [torch.full((4,), float(i), device="cuda") for i in range(5)]
    outs = [cf(x) for x in xs]
    for i, o in enumerate(outs):
        torch.testing.assert_close(o, torch.full((4,), 2.0 * i + 1, device="cuda"))


def test_data_dependent_control_flow_runs_on_the_stream():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    cf = cu.compile(f, target="cuda", fallback="error")
    for s in (1.0, -1.0, 1.0):
        x = torch.ones(8, device="cuda") * s
        torch.testing.assert_close(cf(x), f(x))
    assert any("control flow" in n for n in cf.stats.notes)


def test_cpu_tensor_is_refused_by_name():
    cf = cu.compile(lambda x: x + 1, target="cuda", fallback="error")
    with pytest.raises(cu.CompileError, match="argument 'x'"):
        cf(torch.ones(3))


def _autocast_region(x, w, g):
    from cuvil.testing.cuda_autocast import autocast_block

    with torch.autocast("cuda", dtype=torch.float16):
        return autocast_block(x, w, g)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_autocast_is_captured(dtype):
    """A ``torch.autocast("cuda")`` region and a call made under CUDA autocast compile
    with CUDA's casting rules: eager's dtypes and values, half kernels in the program."""
    from cuvil.testing.conformance import TOLERANCES
    from cuvil.testing.cuda_autocast import autocast_block, autocast_block_args

    def on_gpu(n):
        return tuple(t.cuda() for t in autocast_block_args(n))

    region = cu.compile(_autocast_region, target="cuda", fallback="error")
    call = cu.compile(autocast_block, target="cuda", fallback="error")
    for n in (3, 7):
        a = on_gpu(n)
        for got, want in zip(region(*a), _autocast_region(*a)):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, **TOLERANCES[torch.float16])
        with torch.autocast("cuda", dtype=dtype):
            got_all, want_all = call(*a), autocast_block(*a)
        for got, want in zip(got_all, want_all):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, **TOLERANCES[dtype])
    assert region.stats.fallbacks == call.stats.fallbacks == 0
    assert region.stats.compiles == 1 and call.stats.compiles == 1
