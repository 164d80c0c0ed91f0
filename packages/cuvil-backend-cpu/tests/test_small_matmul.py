"""Matrix products with a small constant inner size written out as multiply-adds on the
``cpu`` target (``cuvil_backend_cpu.small_matmul``), checked against eager PyTorch
(values and dtypes): K from 2 to MAX_K, batch dimensions that broadcast, transposed
operands, two sizes through one compile, a consumer fused after it, and the products
that keep the library call. The inner size is constant where one operand is a weight
(a closure, global or parameter: its sizes are fixed); with ``dynamic=True`` two
arguments' inner size is a size symbol, and the product keeps the library call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu import small_matmul
from cuvil_backend_cpu.testing import executable_of


def compiled(fn: Callable[..., Any]) -> Any:
    return cu.compile(fn, target="cpu", fallback="error", dynamic=True)


def lowered(f: Any) -> str:
    return executable_of(f).stages["tensor_ir"]


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def times(w: torch.Tensor, *, left: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x @ w`` (or ``w @ x``) with ``w`` a closure: its sizes are constants."""
    return (lambda x: w @ x) if left else (lambda x: x @ w)


@pytest.mark.parametrize("k", [2, 3, small_matmul.MAX_K])
def test_small_k_two_sizes_one_compile(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    fn = times(torch.randn(k, 130, generator=g))
    f = compiled(fn)
    for m in (5, 33):
        x = torch.randn(m, k, generator=g)
        check(f(x), fn(x))
    assert len(f.graphs) == 1
    assert "matmul" not in lowered(f)


@pytest.mark.parametrize(
    "sx,sw,left",
    [
        ((2, 5, 3), (3, 7), False),
        ((1, 5, 3), (4, 3, 7), False),
        ((4, 1, 5, 2), (3, 2, 6), False),
        ((2, 4, 3), (2, 5, 4), True),
        ((3, 4, 6), (6, 4), True),
    ],
)
def test_batch_dimensions_broadcast_as_matmul(sx: tuple[int, ...], sw: tuple[int, ...], left: bool) -> None:
    g = torch.Generator().manual_seed(1)
    fn = times(torch.randn(*sw, generator=g), left=left)
    x = torch.randn(*sx, generator=g)
    f = compiled(fn)
    check(f(x), fn(x))
    assert "matmul" not in lowered(f)


def test_transposed_operands_and_a_fused_consumer() -> None:
    wt = torch.randn(11, 4, generator=torch.Generator().manual_seed(2))

    def fn(a: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a.t() @ wt.t(), dim=-1)

    f = compiled(fn)
    for n in (9, 20):
        a = torch.randn(4, n)
        check(f(a), fn(a))
    assert "matmul" not in lowered(f)


def test_the_mission_head() -> None:
    w = torch.randn(3, 1000, generator=torch.Generator().manual_seed(3))

    def head(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.mean((2, 3)) @ w, dim=-1)

    f = compiled(head)
    for b in (1, 4):
        x = torch.randn(b, 3, 16, 16)
        check(f(x), head(x))
    assert "matmul" not in lowered(f)


@pytest.mark.parametrize(
    "k,dtype,vector",
    [(small_matmul.MAX_K + 1, torch.float32, False), (3, torch.float64, False), (3, torch.float32, True)],
    ids=["k_too_large", "float64", "matrix_vector"],
)
def test_kept_as_library_calls(k: int, dtype: Any, vector: bool) -> None:
    g = torch.Generator().manual_seed(4)
    w = torch.randn(k, 6, generator=g, dtype=dtype)
    fn = times(w[:, 0] if vector else w)
    x = torch.randn(5, k, generator=g, dtype=dtype)
    f = compiled(fn)
    check(f(x), fn(x))
    assert "matmul" in lowered(f)


def test_a_symbolic_inner_size_is_kept() -> None:
    # dynamic=True leaves two arguments' K a size symbol: not a constant, so not rewritten
    f = compiled(mm)
    for k in (3, 4):
        a, b = torch.randn(5, k), torch.randn(k, 6)
        check(f(a, b), mm(a, b))
    assert len(f.graphs) == 1 and "matmul" in lowered(f)
