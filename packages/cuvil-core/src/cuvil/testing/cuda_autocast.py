"""Eager PyTorch under CUDA autocast, on a machine without a GPU: the reference for the
CUDA autocast rules Cuvil captures (:data:`cuvil.autocast.CUDA_POLICY`).

Autocast is a dispatch key of the tensors' device (``AutocastCUDA``), and torch's CPU
build registers CUDA's autocast kernels too. :class:`OnCuda` is a tensor that says it is
on ``cuda`` (so those kernels see it, and cast it as they would a CUDA tensor) and
computes on the CPU tensor it wraps. :func:`eager_under_cuda_autocast` runs a function on
such tensors with CUDA autocast on (``torch.set_autocast_enabled``: the context manager
disables itself without CUDA) and returns plain CPU tensors: eager's dtypes and values
under CUDA's casting rules, computed by CPU kernels.

Two places where a CPU build cannot do what a CUDA one does, each done as torch's C++
does it: the CPU kernel of softmax and log-softmax refuses a float16 operand with a
float32 result (``dtype=torch.float32``, which CUDA autocast passes), so it runs on the
operand widened first (the same values); and a tensor claiming CUDA cannot be converted
inside a composite op (a CUDA device guard), which softmax's ``input.toType(dtype)`` does
for a bfloat16 or float32 operand under autocast, so that conversion is made before the
call (and softmax then runs on the float32 operand, as torch's C++ runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

_HALF_TO_FLOAT = {torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default}
_SOFTMAX = {
    torch.softmax,
    torch.log_softmax,
    torch.Tensor.softmax,
    torch.Tensor.log_softmax,
    torch.nn.functional.softmax,
    torch.nn.functional.log_softmax,
}


class OnCuda(torch.Tensor):
    """A CPU tensor that dispatches as a CUDA one (autocast included)."""

    wrapped: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> OnCuda:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls,
            inner.shape,
            strides=inner.stride(),
            dtype=inner.dtype,
            device=torch.device("cuda"),
            dispatch_device=True,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.wrapped = inner

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        kwargs = kwargs or {}
        x = args[0] if args else None
        if (
            func in _SOFTMAX
            and isinstance(x, OnCuda)
            and x.dtype in (torch.bfloat16, torch.float32)
            and torch.is_autocast_enabled("cuda")
            and kwargs.get("dtype") is None
            and len(args) < 3
        ):
            # autocast passes dtype=float32; softmax.int runs _softmax(input.toType(kFloat)),
            # whose conversion a CUDA-claiming tensor cannot make there: made here, first
            torch.set_autocast_enabled("cuda", False)
            try:
                return func(x.float(), *args[1:], **kwargs)
            finally:
                torch.set_autocast_enabled("cuda", True)
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        if func is torch.ops.prim.device.default:  # autocast asks where a tensor is
            return torch.device("cuda")
        args, kwargs = tree_map(_unwrap, (args, kwargs or {}))
        if func in _HALF_TO_FLOAT and args[2] and args[0].dtype != torch.float32:
            out = func(args[0].float(), args[1], False)
        else:
            out = func(*args, **kwargs)
        return tree_map(lambda t: OnCuda(t) if isinstance(t, torch.Tensor) else t, out)


def _unwrap(x: Any) -> Any:
    if isinstance(x, OnCuda):
        return x.wrapped
    if isinstance(x, torch.device) and x.type == "cuda":
        return torch.device("cpu")
    return x


def eager_under_cuda_autocast(fn: Callable[..., Any], args: tuple[Any, ...], dtype: torch.dtype) -> Any:
    """``fn(*args)`` in eager PyTorch under ``torch.autocast("cuda", dtype=dtype)``, its
    tensor arguments standing for CUDA tensors; the results as CPU tensors."""
    wrapped = tree_map(lambda t: OnCuda(t) if isinstance(t, torch.Tensor) else t, args)
    was_on, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        with torch.no_grad():
            out = fn(*wrapped)
    finally:
        torch.set_autocast_enabled("cuda", was_on)
        torch.set_autocast_dtype("cuda", was_dtype)
    return tree_map(_unwrap, out)


def autocast_block(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One op of each CUDA autocast policy, and ops of none, on a lower-precision value."""
    import torch.nn.functional as F

    h = F.linear(x, w)  # lower
    return (
        torch.softmax(h, -1),  # float32 unless the call names a dtype
        h.sum(-1),  # float32 unless the call names a dtype
        h.sum(0, dtype=h.dtype),  # ... which it does: stays in h's dtype
        torch.cumsum(h, 0),  # float32 unless dtype
        torch.exp(h),  # fp32
        F.layer_norm(h, (h.shape[-1],), g),  # fp32 (no policy on CPU)
        h**2,  # fp32 (pow)
        torch.addcmul(h, h, x @ w.t()),  # promote: the widest operand (lower @ lower: lower)
        torch.sigmoid(h) * 2 + h.abs(),  # no policy: in h's dtype
        x.float().sum(),  # float32 operands of an fp32 op: unchanged
    )


def autocast_block_args(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + n)
    return torch.randn(n, 8, generator=g), torch.randn(6, 8, generator=g) / 3, torch.randn(6, generator=g)


__all__ = ["OnCuda", "autocast_block", "autocast_block_args", "eager_under_cuda_autocast"]
