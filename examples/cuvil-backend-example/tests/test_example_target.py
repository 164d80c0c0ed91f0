"""The ``example`` target is discovered like any other and fuses like the built-in ones."""

import torch

import cuvil as cu
from cuvil_runtime.registry import discover


def test_listed_by_cuvil_backends_from_its_distribution():
    info = {b.name: b for b in discover()}["example"]
    assert info.available, info.reason
    assert info.distribution == "cuvil-backend-example"
    assert info.stages == ("graph_ir", "tensor_ir", "triton", "wrapper")


def test_a_softmax_chain_is_one_kernel_for_every_batch_size():
    def f(x, b):
        return torch.softmax(torch.nn.functional.gelu(x + b), dim=-1)

    cf = cu.compile(f, target="example", fallback="error")
    for n in (2, 9):
        x, b = torch.randn(n, 40), torch.randn(40)
        torch.testing.assert_close(cf(x, b), f(x, b))
    assert cf.stats.compiles == 1
    report = cf.artifacts[-1].executable.report
    assert (report.kernels, report.externs) == (1, 0)
