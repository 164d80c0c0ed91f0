"""Extern calls that write into a planned buffer (``out=`` variants of torch ops).

An extern listed here gets its result buffer from the memory plan (an arena
slice, or a fresh output), so a matmul in a loop of calls never allocates and
never page-faults a new result. Each function takes ``(out, *inputs, **attrs)``
exactly as the op's reference takes ``(*inputs, **attrs)``.
"""

from __future__ import annotations

import weakref
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


# -- channels-last convolutions --------------------------------------------------------
#: id(weight) -> (a weak reference to it, its version counter when converted, the copy)
_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}


def channels_last_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` in channels-last layout, converted once per weight and reused until the
    weight changes (its version counter moves) or is dropped: converting the
    weights of a network on every call would cost more than the layout gains."""
    if w.dim() != 4 or w.is_contiguous(memory_format=torch.channels_last):
        return w
    key = id(w)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version:
        return hit[2]
    packed = w.contiguous(memory_format=torch.channels_last)

    # (tensors compare elementwise, so they cannot key a WeakKeyDictionary)
    def forget(_: object, key: int = key) -> None:
        _PACKED.pop(key, None)

    _PACKED[key] = (weakref.ref(w, forget), w._version, packed)
    return packed


def _conv_channels_last(reference: Callable[..., Any]) -> Callable[..., Any]:
    def conv(x: torch.Tensor, w: torch.Tensor, *rest: Any, **attrs: Any) -> Any:
        return reference(x, channels_last_weight(w), *rest, **attrs)

    return conv


#: ops whose extern call wants its weight prepacked channels-last (the input already is)
LAYOUT_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {"conv": _conv_channels_last}
