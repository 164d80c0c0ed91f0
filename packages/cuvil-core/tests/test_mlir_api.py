"""``cu.to_mlir`` / ``cu.run_mlir``: a function's graph through real, upstream MLIR."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu

pytest.importorskip("torch_mlir")


def block(x, w, b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    return torch.softmax(h @ w + b, dim=-1).sum(0)


def test_to_mlir_is_verified_upstream_mlir() -> None:
    x, w, b = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    text = cu.to_mlir(block, x, w, b)
    assert "func.func @block" in text and "tensor<?x?xf32>" in text  # dynamic sizes stay '?'
    assert "linalg" in text and "torch." not in text  # upstream dialects only
    assert cu.to_mlir(block, x, w, b) == text  # deterministic


def test_run_mlir_matches_eager_at_two_sizes() -> None:
    for n in (3, 7):
        args = torch.randn(n, 4), torch.randn(4, 5), torch.randn(5)
        (got,) = cu.run_mlir(block, *args)
        torch.testing.assert_close(got, block(*args), rtol=1e-4, atol=1e-5)


def test_module_parameters_reach_mlir() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh()).eval()
    x = torch.randn(2, 4)
    (got,) = cu.run_mlir(m, x)
    with torch.no_grad():
        torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)
