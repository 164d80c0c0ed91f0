"""Small programs that each fuse into one kernel: the golden-text cases of the kernel
generators (the ``cuda`` and ``ascend`` targets' ``tests/golden/*.triton``).

``KERNEL_CASES[name] = (fn, make)``: ``make(n)`` gives the arguments at batch size
``n``, so a test can compile once and check two sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def softmax_dropout(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(torch.softmax(x, dim=-1), p=0.1, training=False)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


KERNEL_CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[torch.Tensor, ...]]]] = {
    "softmax_dropout": (softmax_dropout, lambda n: (torch.randn(n, 8),)),
    "layer_norm": (layer_norm, lambda n: (torch.randn(n, 16), torch.randn(16), torch.randn(16))),
    "bias_gelu": (bias_gelu, lambda n: (torch.randn(n, 3, 4), torch.randn(4))),
    "column_sum": (column_sum, lambda n: (torch.randn(n, 5),)),
}

__all__ = ["KERNEL_CASES", "bias_gelu", "column_sum", "layer_norm", "softmax_dropout"]
