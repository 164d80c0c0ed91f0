"""A primitive op whose scalar function has a decomposition, written in other ops.

An elementwise primitive names its Tensor IR scalar function (``Op.scalar``). When
that function has a decomposition in :data:`cuvil_ir.scalar_functions.TABLE`
([Note: scalar decompositions]), a consumer of Graph IR without a native form of the op
(ONNX export) writes it as that decomposition's ops, through the same path as a
composite's (:func:`cuvil_ir.graph_ir.decompose.expand` with ``decompose=``). Each
scalar function of the decomposition becomes the primitive op computing it
(:func:`op_computing`).

This is the function-level counterpart of :mod:`cuvil_ir.graph_ir.fallbacks` (op-level
expansions written by hand); Tensor IR lowering never reads either.
"""

from __future__ import annotations

import functools

from cuvil_ir import scalar_functions
from cuvil_ir.graph_ir.decompose import Builder, Decomposition, NotDecomposed, Sym
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import TensorType


@functools.cache
def _computing() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in sorted(REGISTRY.names()):
        op = REGISTRY.get(name)
        if op.scalar is None or op.decompose is not None or "elementwise" not in op.traits:
            continue
        if op.scalar == name or op.scalar not in out:  # the op of the function's own name first
            out[op.scalar] = name
    return out


def op_computing(fn: str) -> str:
    """The elementwise primitive whose scalar function is ``fn`` (the op of that name
    when there is one); :class:`NotDecomposed` when none is."""
    op = _computing().get(fn)
    if op is None:
        raise NotDecomposed(f"no primitive op computes the scalar function {fn}")
    return op


def scalar_decomposition(op: str) -> Decomposition | None:
    """``op`` written as its scalar function's decomposition in other primitive ops, or
    ``None`` when ``op`` is not an elementwise primitive whose function has one."""
    decl = REGISTRY.get(op) if op in REGISTRY else None
    if decl is None or decl.decompose is not None or decl.scalar is None:
        return None
    fn = decl.scalar
    if not scalar_functions.decomposed(fn):
        return None

    float_only = scalar_functions.TABLE[fn].float_only

    def decompose(b: Builder, *xs: Sym, **attrs: object) -> Sym:
        want = b.out_type()
        if float_only and isinstance(want, TensorType):  # integers in the result's float dtype
            xs = tuple(x if x.dtype.is_floating else x.cast(want.dtype) for x in xs)
        operands: list[Sym | float] = list(xs)
        result = scalar_functions.expand(
            fn, operands, lambda name, ops: b.op(op_computing(name), *ops), lambda v: v
        )
        if not isinstance(result, Sym):
            raise NotDecomposed(f"{op}: the decomposition of {fn} is a constant")
        return result

    return decompose


__all__ = ["op_computing", "scalar_decomposition"]
