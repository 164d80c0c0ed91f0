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
#: (with oneDNN, linear runs as FAST_EXTERNS["linear"] instead, which returns a new tensor)


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
_LAYOUT_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "conv": _conv_channels_last
}


# -- oneDNN linear ------------------------------------------------------------------------
#: below this many multiply-adds a oneDNN call costs more than it saves (primitive setup)
ONEDNN_MIN_MACS = 1 << 20
_LINEAR_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}


def _onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_linear_weight(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w`` reordered for oneDNN once per weight and version (as the conv weights are)."""
    key = id(w)
    hit = _LINEAR_PACKED.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version:
        return hit[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

    def forget(_: object, key: int = key) -> None:
        _LINEAR_PACKED.pop(key, None)

    _LINEAR_PACKED[key] = (weakref.ref(w, forget), w._version, packed)
    return packed


def linear(x: torch.Tensor, w: torch.Tensor, *bias: torch.Tensor, has_bias: bool) -> torch.Tensor:
    """``F.linear`` through oneDNN for large float32 products, MKL (torch's default) for
    small ones. On this AMD EPYC host oneDNN's GEMM is 2.5x MKL's for transformer-sized
    linears (768x3072 at 128 rows: 1.28 vs 3.12 ms), while each oneDNN call costs ~10 us
    of setup that only pays off from about a million multiply-adds."""
    b = bias[0] if has_bias else None
    rows = x.numel() // max(x.shape[-1], 1)
    if (
        x.dtype == torch.float32
        and w.dtype == torch.float32
        and rows * w.shape[0] * w.shape[1] >= ONEDNN_MIN_MACS
        and _ONEDNN
    ):
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), _packed_linear_weight(w, rows), b, "none", [], ""
        )
    return torch.nn.functional.linear(x, w, b)


_ONEDNN = _onednn_available()

#: ops run by a faster implementation than their eager reference (same results within
#: float reassociation)
FAST_EXTERNS: dict[str, Callable[..., Any]] = {"linear": linear} if _ONEDNN else {}


def implementation(op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
    """What an extern call of ``op`` runs: a faster implementation where there is one
    (oneDNN linears), wrapped for channels-last operands where the op wants it
    (prepacked convolution weights), else the op's eager reference."""
    fn = FAST_EXTERNS.get(op, reference)
    if channels_last and op in _LAYOUT_WRAPPERS:
        fn = _LAYOUT_WRAPPERS[op](fn)
    return fn
