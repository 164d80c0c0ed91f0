"""Shared pieces of shape/dtype rules: broadcasting, promotion, dim handling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import Dim, Shape, ShapeContext


class ShapeError(ValueError):
    """Operands whose shapes or dtypes the op cannot accept."""


def tensor_of(t: Type, what: str = "operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise ShapeError(f"{what} must be a tensor, got {t}")
    return t


def norm_dim(dim: int, rank: int) -> int:
    """Wrap a possibly negative axis into [0, rank)."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise ShapeError(f"dimension {dim} out of range for rank {rank}")
    return dim % r


def norm_dims(dims: int | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Reduction axes; ``None`` or ``()`` means all axes (torch semantics)."""
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    if len(dims) == 0:
        return tuple(range(rank))
    out = tuple(sorted({norm_dim(d, rank) for d in dims}))
    return out


def broadcast_shapes(ctx: ShapeContext, *shapes: Shape) -> Shape:
    """Numpy broadcasting over symbolic dims; facts that need deciding become assumptions."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        result: Dim = 1
        for d in dims:
            if _is_one(ctx, result):
                result = d
            elif _is_one(ctx, d):
                continue
            elif not ctx.equal(result, d, "broadcast"):
                raise ShapeError(f"shapes {[tuple(map(str, s)) for s in shapes]} do not broadcast")
        out.append(result)
    return tuple(out)


def _is_one(ctx: ShapeContext, d: Dim) -> bool:
    if isinstance(d, int):
        return d == 1
    return ctx.decide(sympy.Eq(d, 1), "broadcast of a possibly size-1 dimension")


def _probe(t: Type) -> Any:
    import torch

    if isinstance(t, ScalarType):
        return {ScalarKind.bool: True, ScalarKind.int: 1, ScalarKind.float: 1.0}[t.kind]
    return torch.empty((1,) * min(t.rank, 1), dtype=t.dtype.torch, device="meta")


def result_dtype(*types: Type) -> DType:
    """torch's type promotion (tensors, 0-d tensors and weak Python scalars)."""
    import torch

    probes = [_probe(t) for t in types]
    if not any(isinstance(p, torch.Tensor) for p in probes):
        raise ShapeError("at least one operand must be a tensor")
    acc = probes[0]
    dtype = None
    for p in probes[1:]:
        dtype = torch.result_type(acc, p)
        acc = torch.empty((1,) if _max_rank(types) else (), dtype=dtype, device="meta")
    if dtype is None:
        return DType.from_torch(acc.dtype)
    return DType.from_torch(dtype)


def _max_rank(types: Sequence[Type]) -> int:
    return max((t.rank for t in types if isinstance(t, TensorType)), default=0)


def device_of(*types: Type) -> str:
    devs = sorted({t.device for t in types if isinstance(t, TensorType) and t.rank > 0}) or sorted(
        {t.device for t in types if isinstance(t, TensorType)}
    )
    if len(devs) > 1:
        raise ShapeError(f"operands are on different devices: {devs}")
    return devs[0] if devs else "cpu"


def float_dtype(d: DType) -> DType:
    """dtype of a float-valued op (exp, mean ...) applied to ``d``."""
    return d if (d.is_floating or d.is_complex) else DType.f32


def numel(shape: Shape) -> Dim:
    n: Any = 1
    for d in shape:
        n = n * d
    return n if isinstance(n, int) else sympy.expand(n)
