"""Fallback decompositions: a *primitive* op written in other ops, for a consumer that has
no native form of it.

A primitive (an op declared without ``decompose``) is one that every renderer implements
natively: Tensor IR lowering has a scalar function for each (``rsqrt`` is one call, not a
``reciprocal`` of a ``sqrt``), and never reads this table. A consumer whose target lacks
one -- ONNX has no ``Rsqrt``, ``Log1p``, ``Expm1``, ``Log2``, ``Square`` or ``Trunc`` --
may expand it with :func:`fallback` instead of spelling the math by hand, through the path
it already uses for composites (:func:`cuvil_ir.graph_ir.decompose.expand` with
``decompose=fallback(op)``), so each formula is written once, here.

A consumer may use a fallback only where it has no native form and the op's declaration
does not refuse it (``extern_reasons``). The expansions are the textbook identities and
are exact up to rounding except where noted: ``log1p`` and ``expm1`` near 0 lose the
relative accuracy a native form keeps (``log(1 + x)`` rounds ``1 + x`` first, so for
``|x|`` below the dtype's epsilon the result is 0 or off by up to ``eps / |x|``
relative; ``exp(x) - 1`` cancels likewise), and ``log2`` is ``log(x) / ln 2``, one more
rounding than a native ``log2``. Low-precision inputs compute in f32, as for every
decomposition.
"""

from __future__ import annotations

import math

from cuvil_ir.graph_ir.decompose import Builder, Decomposition, NotDecomposed, Sym, where
from cuvil_ir.graph_ir.types import TensorType


def _operand(b: Builder, x: Sym) -> Sym:
    """``x`` in the op's result dtype when it is not a float: an integer or bool input
    is converted first, as the op's own rule does (``rsqrt`` of int32 is f32, ``square``
    of bool is int64); a float input stays as the expansion gave it (f16/bf16 already
    upcast to f32)."""
    want = b.out_type()
    if not isinstance(want, TensorType):
        raise NotDecomposed(f"{b.node.op}: expected a tensor result, got {want}")
    return x if x.dtype.is_floating else x.cast(want.dtype)


def _rsqrt(b: Builder, x: Sym) -> Sym:
    return b.op("reciprocal", _operand(b, x).sqrt())


def _log1p(b: Builder, x: Sym) -> Sym:
    # less accurate than a native log1p for |x| near 0 (see the module docstring)
    return (_operand(b, x) + 1.0).log()


def _expm1(b: Builder, x: Sym) -> Sym:
    # less accurate than a native expm1 for |x| near 0 (see the module docstring)
    return _operand(b, x).exp() - 1.0


def _log2(b: Builder, x: Sym) -> Sym:
    return _operand(b, x).log() / math.log(2.0)


def _square(b: Builder, x: Sym) -> Sym:
    x = _operand(b, x)
    return x * x


def _trunc(b: Builder, x: Sym) -> Sym:
    x = _operand(b, x)
    if not x.dtype.is_floating:
        return x  # an integer is its own truncation
    return where(x < 0.0, b.op("ceil", x), b.op("floor", x))


#: primitive op -> its decomposition into other registered ops, for consumers without it
FALLBACKS: dict[str, Decomposition] = {
    "rsqrt": _rsqrt,
    "log1p": _log1p,
    "expm1": _expm1,
    "log2": _log2,
    "square": _square,
    "trunc": _trunc,
}


def fallback(op_name: str) -> Decomposition | None:
    """The fallback decomposition of the primitive ``op_name``, or ``None`` when it has
    none (see the module docstring for when a consumer may use it)."""
    return FALLBACKS.get(op_name)


__all__ = ["FALLBACKS", "fallback"]
