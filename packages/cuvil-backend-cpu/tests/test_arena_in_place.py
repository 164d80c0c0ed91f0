"""The arena never puts a kernel's result in the slot of a temporary it reads when the
kernel computes a reduction (cuvil_ir/tensor_ir/memory.py, ``_in_place``): the schedule
may accumulate the reduction in the result's buffer before it reads the other operands.

Found as a wrong result of a three-layer cache-like step: each layer's ``sum(...) + out``
was written over ``out`` while it was still to be read."""

from __future__ import annotations

import pytest
import torch

import cuvil as cu


def _layers(x: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:
    out = x
    for k in (k0, k1, k2):
        k[3] = out  # an extern between the kernels: each layer's result is a temporary
        out = k[:4].sum(0) * 0.5 + out
    return out


def _reduce_then_add(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    t = torch.relu(x) + 1.0
    u = y.sum(0) + t  # reads t at its own element, after a reduction
    v = z.amax(0) - u
    return v * 2.0


@pytest.mark.parametrize("width", [4, 33, 100])
def test_layers_of_reductions_over_updated_tensors(width: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(width)
    mine = [torch.randn(16, width) for _ in range(3)]
    theirs = [k.clone() for k in mine]
    f = cu.compile(_layers, target="cpu", fallback="error")
    got, want = f(x, *mine), _layers(x, *theirs)
    torch.testing.assert_close(got, want)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_a_reduction_plus_a_dying_temporary(rows: int) -> None:
    torch.manual_seed(1)
    x, y, z = torch.randn(37), torch.randn(rows, 37), torch.randn(rows, 37)
    f = cu.compile(_reduce_then_add, target="cpu", fallback="error")
    torch.testing.assert_close(f(x, y, z), _reduce_then_add(x, y, z))
