"""Answers to metadata queries on proxies (``x.shape``, ``x.dtype``, ``x.dim()`` ...).

These never become graph nodes: they are answered from the proxy's IR type
(``is_contiguous``: from eager's layout, :mod:`cuvil.frontend.layout`).
Sizes come back as ``torch.SymInt`` so arithmetic on them stays symbolic.
"""

from __future__ import annotations

from typing import Any

import torch

from cuvil.errors import CompileError
from cuvil.frontend import layout
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer_view import TracerView

UNHANDLED = object()
T = torch.Tensor


def _shape(tracer: TracerView, p: TensorProxy) -> torch.Size:
    return torch.Size([tracer.size(d) for d in p.ir_type.shape])


def _size(tracer: TracerView, p: TensorProxy, dim: Any = None) -> Any:
    shape = _shape(tracer, p)
    if dim is None:
        return shape
    rank = len(shape)
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise IndexError(f"dimension {dim} out of range for a tensor of rank {rank}")
    return shape[dim]


def _numel(tracer: TracerView, p: TensorProxy) -> Any:
    n: Any = 1
    for d in _shape(tracer, p):
        n = n * d
    return n


_METHODS: dict[Any, Any] = {
    T.size: _size,
    T.dim: lambda tr, p: p.ir_type.rank,
    T.ndimension: lambda tr, p: p.ir_type.rank,
    T.numel: _numel,
    T.nelement: _numel,
    T.__len__: lambda tr, p: int(_shape(tr, p)[0]) if p.ir_type.rank else _len_error(),
    T.is_contiguous: lambda tr, p, memory_format=torch.contiguous_format: layout.is_contiguous(
        tr, p, memory_format
    ),
    T.stride: lambda tr, p, *a, **k: _stride_error(tr),
    T.is_floating_point: lambda tr, p: p.ir_type.dtype.is_floating,
    T.is_complex: lambda tr, p: p.ir_type.dtype.is_complex,
    T.is_signed: lambda tr, p: p.ir_type.dtype.torch.is_signed,
    # traced values are plain: never lazily conjugated or negated views, never inference tensors
    T.is_conj: lambda tr, p: False,
    T.is_neg: lambda tr, p: False,
    T.is_inference: lambda tr, p: False,
    T.element_size: lambda tr, p: p.ir_type.dtype.torch.itemsize,
    T.get_device: lambda tr, p: torch.device(p.ir_type.device).index if p.ir_type.device != "cpu" else -1,
    T.__hash__: lambda tr, p: id(p),
    T.__repr__: lambda tr, p: repr(p),
    T.requires_grad_: lambda tr, p, requires_grad=True: p,
    T.detach: lambda tr, p: p,
    T.contiguous: lambda tr, p, memory_format=None: layout.contiguous(tr, p, memory_format),
}


# the torch-level spellings (``torch.is_floating_point(x)``) are other callables than the methods
def _same_size(tracer: TracerView, p: TensorProxy, other: Any) -> Any:
    # compared as SymInts: torch decides, and what it decides becomes a size assumption
    return _shape(tracer, p) == (_shape(tracer, other) if isinstance(other, TensorProxy) else other.shape)


_METHODS[T.is_same_size] = _same_size
_QUERIES = ("numel", "is_floating_point", "is_complex", "is_signed", "is_conj", "is_neg", "is_inference")
for _name in (*_QUERIES, "get_device", "is_same_size"):
    _METHODS[getattr(torch, _name)] = _METHODS[getattr(T, _name)]


def _result_type(tracer: TracerView, tensor: Any, other: Any) -> torch.dtype:
    """``torch.result_type``: promotion reads only dtypes and whether a tensor is 0-d."""
    return torch.result_type(_stand_in(tensor), _stand_in(other))


def _stand_in(v: Any) -> Any:
    if isinstance(v, TensorProxy):
        return torch.empty((1,) * v.ir_type.rank, dtype=v.ir_type.dtype.torch, device="meta")
    return v


_ATTRS: dict[str, Any] = {
    "shape": _shape,
    "dtype": lambda tr, p: p.ir_type.dtype.torch,
    "itemsize": lambda tr, p: p.ir_type.dtype.torch.itemsize,
    "nbytes": lambda tr, p: _numel(tr, p) * p.ir_type.dtype.torch.itemsize,
    "device": lambda tr, p: torch.device(p.ir_type.device),
    "ndim": lambda tr, p: p.ir_type.rank,
    "is_cuda": lambda tr, p: p.ir_type.device.startswith("cuda"),
    "is_cpu": lambda tr, p: p.ir_type.device == "cpu",
    "is_meta": lambda tr, p: False,
    "is_sparse": lambda tr, p: False,
    "is_quantized": lambda tr, p: False,
    "is_nested": lambda tr, p: False,
    "is_mkldnn": lambda tr, p: False,
    "requires_grad": lambda tr, p: False,
    "is_leaf": lambda tr, p: True,
    "grad": lambda tr, p: None,
    "grad_fn": lambda tr, p: None,
    "layout": lambda tr, p: torch.strided,
    "data": lambda tr, p: p,
    "names": lambda tr, p: (None,) * p.ir_type.rank,
    "_base": lambda tr, p: None,
}


def _len_error() -> Any:
    raise TypeError("len() of a 0-d tensor")


def _stride_error(tracer: TracerView) -> Any:
    # eager's strides of a size-1 dim, an argument's exact strides ...: not worth a guard
    raise CompileError(
        "x.stride() is not answered in compiled code: the compiled code picks its own layouts",
        tracer.source_loc(),
        "ask x.is_contiguous() (answered as eager would), or call x.stride() outside the compiled function",
    )


def answer(tracer: TracerView, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if func is torch.result_type and any(isinstance(a, TensorProxy) for a in args):
        return _result_type(tracer, *args, **kwargs)
    if not args or not isinstance(args[0], TensorProxy):
        return UNHANDLED
    self = args[0]
    if getattr(func, "__name__", None) == "__get__":
        desc = getattr(func, "__self__", None)
        attr = getattr(desc, "__name__", None)
        fn = _ATTRS.get(attr)  # type: ignore[arg-type]
        if fn is not None:
            return fn(tracer, self)
        if attr in ("T", "mT", "H", "mH"):
            return _transpose_attr(tracer, self, attr)
        return UNHANDLED
    try:
        fn = _METHODS.get(func)
    except TypeError:
        return UNHANDLED
    if fn is None:
        return UNHANDLED
    return fn(tracer, self, *args[1:], **kwargs)


def _transpose_attr(tracer: TracerView, p: TensorProxy, attr: str) -> Any:
    rank = p.ir_type.rank
    if attr in ("T", "H"):
        return p.permute(*reversed(range(rank))) if rank >= 2 else p
    return p.transpose(-2, -1)
