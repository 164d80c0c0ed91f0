"""Extern calls that write into a planned buffer (``out=`` variants of torch ops).

An extern listed here gets its result buffer from the memory plan (an arena
slice, or a fresh output), so a matmul in a loop of calls never allocates and
never page-faults a new result. Each function takes ``(out, *inputs, **attrs)``
exactly as the op's reference takes ``(*inputs, **attrs)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def linear_into(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor, has_bias: bool
) -> None:
    x2 = x.reshape(-1, x.shape[-1])
    o2 = out.view(-1, out.shape[-1])
    if has_bias:
        torch.addmm(bias[0], x2, w.t(), out=o2)
    else:
        torch.mm(x2, w.t(), out=o2)


def matmul_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() >= 2 and b.dim() >= 2:
        torch.matmul(a, b, out=out)
    else:  # torch's matrix-vector forms want an out of another shape (and would resize ours)
        out.copy_(torch.matmul(a, b))


OUT_VARIANTS: dict[str, Callable[..., Any]] = {"linear": linear_into, "matmul": matmul_into}
