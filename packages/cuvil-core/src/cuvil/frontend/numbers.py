"""Python numbers that a captured loop or ``if`` changes, carried as 0-d tensors.

A Python ``int``/``float``/``bool`` assigned in the body of a loop on a tensor or
size condition (``i += 1``), or to different values in the branches of an ``if``
on one, has a value only known at run time, so it travels through the structured
op as a 0-d tensor, as TensorFlow's AutoGraph does: ``int`` as ``int64``,
``float`` as ``float64`` (a Python float's precision, so accumulated values
match), ``bool`` as ``bool``. What comes out is a :class:`NumberProxy`: a tensor
proxy that keeps Python's arithmetic (``i + 1`` and ``i / 2`` stay numbers,
``int / int`` is a ``float64``, ``True + True`` is an ``int``, ``i += 1`` rebinds
instead of updating in place) and that the compiled function returns as a Python
number (``.item()`` of the graph output), as eager returns it. Combined with a
tensor (``x * i``) it is a 0-d tensor, which torch's type promotion treats like
the number it stands for (a float meeting only integer tensors is first cast to the
default dtype: ``torch_calls.weak_numbers``).
"""

from __future__ import annotations

from typing import Any

import torch

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.types import DType, TensorType

#: Python's numeric tower, narrowest first
_TOWER: tuple[type, ...] = (bool, int, float)
_DTYPE = {bool: DType.bool, int: DType.i64, float: DType.f64}
_KIND = {DType.bool: bool, DType.i64: int, DType.f64: float}


def kind(v: Any) -> type | None:
    """The Python number type ``v`` stands for (a number, a size, a :class:`NumberProxy`)."""
    if isinstance(v, NumberProxy):
        return _KIND.get(v.ir_type.dtype)
    if isinstance(v, TensorProxy):
        return None
    for k, sym in ((bool, torch.SymBool), (int, torch.SymInt), (float, torch.SymFloat)):
        if isinstance(v, (k, sym)):
            return k
    return None


def _wider(a: type, b: type) -> type:
    return max(a, b, key=_TOWER.index)


def _fits(k: type, dtype: DType) -> bool:
    """Can a tensor of ``dtype`` hold every value of Python type ``k``?"""
    if k is bool:
        return True
    if k is int:
        return dtype != DType.bool
    return dtype.is_floating or dtype.is_complex


def carried_type(a: Any, b: Any, device: str) -> TensorType | None:
    """The tensor type that carries both ``a`` and ``b`` (values of one variable on two
    paths, at least one a Python number), or ``None`` when there is none."""
    ka, kb = kind(a), kind(b)
    if ka is not None and kb is not None:
        return TensorType(_DTYPE[_wider(ka, kb)], (), device)
    for t, n in ((a, b), (b, a)):
        k = kind(n)
        if isinstance(t, TensorProxy) and k is not None and _fits(k, t.ir_type.dtype):
            return t.ir_type
    return None


def as_tensor(tracer: Tracer, v: Any, t: TensorType, loc: SourceLoc | None) -> Any:
    """``v`` (a proxy, a Python number or a size) as a tensor of type ``t``, emitted
    in the region being traced; ``v`` itself when ``t`` cannot hold it (the caller's
    type check reports it)."""
    k = kind(v)
    if k is None or not _fits(k, t.dtype):
        return v
    if isinstance(v, NumberProxy):
        return v if v.ir_type == t else torch.Tensor.to(v, t.dtype.torch)  # a wider number
    if isinstance(v, torch.SymBool):
        raise CompileError(
            "a size predicate is carried through a captured loop or `if`",
            loc,
            "compute it as a tensor (torch.tensor(...)) or keep it out of the loop",
        )
    shape = [tracer.size(d) for d in t.shape]
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        zero = torch.zeros(shape, dtype=t.dtype.torch, device=t.device)
        return zero + v
    value = float(v) if t.dtype.is_floating else (bool(v) if t.dtype == DType.bool else int(v))
    return torch.full(shape, value, dtype=t.dtype.torch, device=t.device)


def number(h: Any) -> NumberProxy:
    """The :class:`NumberProxy` for the same graph value as the proxy ``h``."""
    return NumberProxy(h._cuvil_tracer, h._cuvil_value)


def _as_kind(p: Any, k: type) -> Any:
    if isinstance(p, NumberProxy) and _KIND[p.ir_type.dtype] is not k:
        return torch.Tensor.to(p, _DTYPE[k].torch)
    return p


def _binary(name: str) -> Any:
    method = getattr(torch.Tensor, name)
    arith = name.strip("_").removeprefix("r") in _ARITH

    def op(self: NumberProxy, other: Any) -> Any:
        k = kind(other)
        if k is None:  # a tensor (or something else torch decides about)
            return method(self, other)
        # Python's result type: bools count as ints in arithmetic, `/` gives a float
        want = _wider(kind(self) or int, k)
        if arith:
            want = float if name in ("__truediv__", "__rtruediv__") else _wider(want, int)
        out = method(_as_kind(self, want), _as_kind(other, want))
        return number(out) if isinstance(out, TensorProxy) else out

    op.__name__ = name
    return op


def _unary(name: str) -> Any:
    method = getattr(torch.Tensor, name)

    def op(self: NumberProxy) -> Any:
        return number(method(_as_kind(self, int) if kind(self) is bool else self))

    op.__name__ = name
    return op


class NumberProxy(TensorProxy):
    """A Python number that is only known at run time: a 0-d ``int64``/``float64``/``bool``
    tensor proxy with Python's arithmetic; returned from the compiled function as a number."""

    __hash__ = TensorProxy.__hash__  # defining __eq__ below would drop it
    _cuvil_weak = True  # see torch_calls.weak_numbers


_ARITH = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")
for _n in (*_ARITH, "and", "or", "xor"):
    setattr(NumberProxy, f"__{_n}__", _binary(f"__{_n}__"))
    setattr(NumberProxy, f"__r{_n}__", _binary(f"__r{_n}__"))
    # numbers are immutable: `i += 1` rebinds `i` (an alias keeps the old value)
    setattr(NumberProxy, f"__i{_n}__", _binary(f"__{_n}__"))
for _n in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(NumberProxy, f"__{_n}__", _binary(f"__{_n}__"))
for _n in ("neg", "abs"):
    setattr(NumberProxy, f"__{_n}__", _unary(f"__{_n}__"))
