"""Fallback decompositions: a *primitive* op written in other ops, for a consumer that has
no native form of it.

A primitive (an op declared without ``decompose``) is one that every renderer implements
natively: Tensor IR lowering has a scalar function for each (``rsqrt`` is one call, not a
``reciprocal`` of a ``sqrt``) or runs it as one library call (``sdpa``: the cpu target's
flash kernel), and never reads this table. A consumer whose target lacks
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
decomposition. ``sdpa`` is torch's math form of attention (below), which MLIR and ONNX
write so instead of a hand-written copy each.
"""

from __future__ import annotations

import math

import sympy

from cuvil_ir.graph_ir.decompose import Builder, Decomposition, NotDecomposed, Sym, where
from cuvil_ir.graph_ir.ops._rules import floordiv
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.symbolic import Dim


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


def _repeat_heads(x: Sym, heads: Dim) -> Sym:
    """``x.repeat_interleave(heads // x.shape[-3], dim=-3)``: each head ``g`` times in a
    row, as unsqueeze, expand and reshape (the op's rule assumed the division exact)."""
    h = x.shape[-3]
    if h == heads:
        return x
    g = floordiv(heads, h)
    lead, rest = x.shape[:-3], x.shape[-2:]
    wide = x.b.op("expand", x.unsqueeze(x.rank - 2), shape=(*lead, h, g, *rest))
    return wide.reshape((*lead, heads, *rest))


def sdpa(
    b: Builder,
    q: Sym,
    k: Sym,
    v: Sym,
    *mask: Sym,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    has_mask: bool,
) -> Sym:
    """torch's math form of attention (``_scaled_dot_product_attention_math``, and the
    reference in ``F.scaled_dot_product_attention``'s documentation): ``q @ kᵀ * scale``,
    ``-inf`` where a bool mask or the causal lower triangle (of ``L x S``, top left) is
    false, a float mask added, a softmax over the keys, ``@ v``; ``scale`` defaults to
    ``1/sqrt(E)``, with ``enable_gqa`` k's and v's heads repeat to q's. A row the mask
    leaves no key in gives zeros, as torch's ``_safe_softmax`` does, not a softmax's NaN
    (found on the mask, which is smaller than the scores; torch also zeroes a row whose
    scores are all ``-inf`` through infinite inputs, which gives NaN here).

    torch multiplies q and k by ``sqrt(scale)`` each rather than the scores by ``scale``;
    the two differ by a rounding of the scores, within every tolerance the tests use (and
    eager on cpu runs its flash kernel, which scales the scores).
    """
    if enable_gqa:
        heads = q.shape[-3]
        k, v = _repeat_heads(k, heads), _repeat_heads(v, heads)
    rank = k.rank
    kt = b.op("permute", k, perm=(*range(rank - 2), rank - 1, rank - 2))
    s = b.op("matmul", q, kt)
    e = q.shape[-1]
    if scale is not None:
        factor: Sym | float = float(scale)
    elif isinstance(e, int):
        factor = 1.0 / math.sqrt(e)
    else:
        factor = b.const(sympy.sympify(e) ** sympy.Rational(-1, 2))
    s = s * factor
    if is_causal:
        length, keys = q.shape[-2], k.shape[-2]
        ones = b.op("full", shape=(length, keys), value=True, dtype=DType.bool, device=s.tensor.device)
        s = where(b.op("tril", ones, diagonal=0), s, -math.inf)
    kept: Sym | None = None
    if has_mask:
        (m,) = mask
        # a bool mask as torch converts it, to 0 and -inf added (the scores' sizes named first)
        bias = where(m, 0.0, -math.inf) if m.dtype == DType.bool else m
        if m.rank > 0:
            # the rows the mask leaves a key in, found on the mask (not on the L x S scores);
            # a row it masks entirely gets a bias of 0 and is zeroed after the softmax
            last = [m.rank - 1]
            if m.dtype == DType.bool:
                kept = b.op("any", m, dims=tuple(last), keepdim=True)
            else:
                kept = m.amax(last, keepdim=True) > -math.inf
            bias = where(kept, bias, 0.0)
        s = s + bias
    p = b.op("softmax", s, dim=s.rank - 1, dtype=None)
    if kept is not None:
        p = p * kept.cast(p.dtype)
    return b.op("matmul", p, v)


#: primitive op -> its decomposition into other registered ops, for consumers without it
FALLBACKS: dict[str, Decomposition] = {
    "rsqrt": _rsqrt,
    "log1p": _log1p,
    "expm1": _expm1,
    "log2": _log2,
    "square": _square,
    "trunc": _trunc,
    "sdpa": sdpa,
}


def fallback(op_name: str) -> Decomposition | None:
    """The fallback decomposition of the primitive ``op_name``, or ``None`` when it has
    none (see the module docstring for when a consumer may use it)."""
    return FALLBACKS.get(op_name)


__all__ = ["FALLBACKS", "fallback", "sdpa"]
