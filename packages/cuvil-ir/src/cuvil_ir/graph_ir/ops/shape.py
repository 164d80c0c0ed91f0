"""Shape ops: reshape, permute, unsqueeze, squeeze, expand (views), and repeat, flip (copies).

torch's many spellings (``view``, ``flatten``, ``transpose``, ``.T``, ``movedim``,
``expand_as`` ...) are captured as these few ops. Calls that change nothing
(``contiguous()``, an identity permutation, squeezing no dim) return their input:
torch returns the tensor itself or an alias of all of it in those cases.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.ops._rules import (
    VIEW,
    ShapeError,
    check_divisible,
    check_equal,
    dim_arg,
    dims_arg,
    floordiv,
    is_one,
    numel,
    size_arg,
    size_args,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import Type
from cuvil_ir.symbolic import Dim, Shape, ShapeContext

T = torch.Tensor


def exact_quotient(ctx: ShapeContext, n: Dim, k: Dim, what: str) -> Dim:
    """``n / k`` where the division must be exact (the -1 of a reshape).

    When sympy cancels the quotient to a polynomial with integer coefficients it
    is exact for every size; otherwise divisibility becomes an assumption and
    the quotient is written ``floor(n/k)`` (an integer either way).
    """
    if isinstance(n, int) and isinstance(k, int):
        if k == 0 or n % k:
            raise ShapeError(f"{what}: {n} elements do not divide into parts of {k}")
        return n // k
    # floor(..), Max(..) ... are generators like symbols: (s - floor(t/2))**2 / (s - floor(t/2))
    # cancels to a polynomial in them (without this, a Mod of rational functions that
    # sympy cannot even expand)
    num, den = sympy.sympify(n), sympy.sympify(k)
    opaque = {a: sympy.Dummy(integer=True) for a in (num.atoms(sympy.Function) | den.atoms(sympy.Function))}
    q = sympy.cancel(num.xreplace(opaque) / den.xreplace(opaque))
    syms = sorted(q.free_symbols, key=lambda s: s.name)
    if syms and q.is_polynomial(*syms) and all(c.is_integer for c in sympy.Poly(q, *syms).coeffs()):
        return sympy.expand(q).xreplace({d: a for a, d in opaque.items()})
    if not syms and q.is_integer:
        return int(q)
    check_divisible(ctx, n, k, what)
    return floordiv(n, k)


def _size(v: Any) -> Dim:
    """A size of a target shape; -1 stays -1 (inferred by the op's rule)."""
    if v == -1 and not isinstance(v, sympy.Basic):
        return -1
    if isinstance(v, torch.dtype):
        raise NotCaptured("view(dtype) reinterprets bits")
    return size_arg(v)


def reshape_shape(ctx: ShapeContext, shape: Shape, target: Shape) -> Shape:
    unknown = [i for i, d in enumerate(target) if isinstance(d, int) and d == -1]
    if len(unknown) > 1 or any(isinstance(d, int) and d < -1 for d in target):
        raise ShapeError(f"reshape to {target}: at most one -1 and no other negative size")
    total = numel(shape)
    known = numel(tuple(d for d in target if not (isinstance(d, int) and d == -1)))
    if not unknown:
        check_equal(ctx, total, known, "reshape element count")
        return target
    if isinstance(known, int) and known == 0:
        raise ShapeError(f"reshape to {target}: -1 is ambiguous next to a size 0")
    out = list(target)
    out[unknown[0]] = exact_quotient(ctx, total, known, "reshape with -1")
    return tuple(out)


class Reshape(Op):
    """``view``/``reshape``: same elements in row-major order, new shape; ``shape`` may hold one -1."""

    name = "reshape"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            T.view,
            T.reshape,
            torch.reshape,
            (T.view_as, _as_other),
            (T.reshape_as, _as_other),
            (torch.flatten, _flatten),
            (T.flatten, _flatten),
            (torch.ravel, _ravel),
            (T.ravel, _ravel),
            (torch.unflatten, _unflatten),
            (T.unflatten, _unflatten),
            (T.contiguous, _identity),
            (T.detach, _identity),
            (torch.detach, _identity),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, *shape: Any) -> Any:
        target = tuple(_size(d) for d in size_args(shape))
        return b.emit("reshape", [input], shape=target)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, shape: tuple[Dim, ...]) -> Type:
        t = tensor_of(x)
        return t.replace(shape=reshape_shape(ctx, t.shape, shape))

    @staticmethod
    def reference(x: Any, *, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)


def _identity(b: Emitter, input: Any, *args: Any, **kwargs: Any) -> Any:
    return input


def _as_other(b: Emitter, input: Any, other: Any) -> Any:
    return b.emit("reshape", [input], shape=tensor_of(b.type_of(other)).shape)


def _flatten(b: Emitter, input: Any, start_dim: Any = 0, end_dim: Any = -1) -> Any:
    t = tensor_of(b.type_of(input))
    if t.rank == 0:
        return b.emit("reshape", [input], shape=(1,))
    s, e = dim_arg(start_dim, t.rank), dim_arg(end_dim, t.rank)
    if s > e:
        raise NotCaptured("flatten with start_dim after end_dim")
    if s == e:
        return input
    return b.emit("reshape", [input], shape=(*t.shape[:s], numel(t.shape[s : e + 1]), *t.shape[e + 1 :]))


def _ravel(b: Emitter, input: Any) -> Any:
    return b.emit("reshape", [input], shape=(-1,))


def _unflatten(b: Emitter, input: Any, dim: Any, sizes: Any) -> Any:
    t = tensor_of(b.type_of(input))
    d = dim_arg(dim, t.rank)
    parts = [_size(s) for s in size_args((sizes,))]
    if -1 in parts:  # resolved against the one dim, not the whole tensor
        i = parts.index(-1)
        rest = numel(tuple(p for j, p in enumerate(parts) if j != i))
        parts[i] = exact_quotient(b.ctx, t.shape[d], rest, "unflatten with -1")
    return b.emit("reshape", [input], shape=(*t.shape[:d], *parts, *t.shape[d + 1 :]))


# -- permutations ---------------------------------------------------------------------
class Permute(Op):
    name = "permute"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.permute,
            T.permute,
            (torch.transpose, _transpose),
            (T.transpose, _transpose),
            (torch.swapaxes, _transpose),
            (T.swapaxes, _transpose),
            (torch.swapdims, _transpose),
            (T.swapdims, _transpose),
            # properties reach __torch_function__ as their descriptors' __get__
            (torch.t, _t),
            (T.t, _t),
            (_getter("T"), _T),
            (_getter("mT"), _mT),
            (torch.movedim, _movedim),
            (T.movedim, _movedim),
            (torch.moveaxis, _movedim),
            (T.moveaxis, _movedim),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, *dims: Any) -> Any:
        t = tensor_of(b.type_of(input))
        return _permute(b, input, tuple(dim_arg(d, t.rank) for d in size_args(dims)))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, perm: tuple[int, ...]) -> Type:
        t = tensor_of(x)
        if sorted(perm) != list(range(t.rank)):
            raise ShapeError(f"{perm} is not a permutation of {t.rank} dims")
        return t.replace(shape=tuple(t.shape[p] for p in perm))

    @staticmethod
    def reference(x: Any, *, perm: tuple[int, ...]) -> Any:
        return x.permute(perm)


def _getter(prop: str) -> Any:
    return getattr(T, prop).__get__


def _permute(b: Emitter, input: Any, perm: tuple[int, ...]) -> Any:
    if perm == tuple(range(len(perm))):
        return input
    return b.emit("permute", [input], perm=perm)


def _swap(rank: int, d0: int, d1: int) -> tuple[int, ...]:
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return tuple(perm)


def _transpose(b: Emitter, input: Any, dim0: Any, dim1: Any) -> Any:
    r = tensor_of(b.type_of(input)).rank
    return _permute(b, input, _swap(r, dim_arg(dim0, r), dim_arg(dim1, r)))


def _t(b: Emitter, input: Any) -> Any:
    r = tensor_of(b.type_of(input)).rank
    if r > 2:
        raise NotCaptured("t() of a tensor with more than 2 dims")
    return _permute(b, input, tuple(reversed(range(r))))


def _T(b: Emitter, input: Any) -> Any:
    r = tensor_of(b.type_of(input)).rank
    return _permute(b, input, tuple(reversed(range(r))))


def _mT(b: Emitter, input: Any) -> Any:
    r = tensor_of(b.type_of(input)).rank
    if r < 2:
        raise NotCaptured("mT of a tensor with fewer than 2 dims")
    return _permute(b, input, _swap(r, r - 2, r - 1))


def _movedim(b: Emitter, input: Any, source: Any, destination: Any) -> Any:
    r = tensor_of(b.type_of(input)).rank
    src = [dim_arg(d, r) for d in (source if isinstance(source, (tuple, list)) else (source,))]
    dst = [dim_arg(d, r) for d in (destination if isinstance(destination, (tuple, list)) else (destination,))]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise NotCaptured("movedim needs as many distinct sources as destinations")
    perm: list[int | None] = [None] * r
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(i for i in range(r) if i not in src)
    return _permute(b, input, tuple(p if p is not None else next(rest) for p in perm))


# -- unit dims --------------------------------------------------------------------------
class Unsqueeze(Op):
    name = "unsqueeze"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.unsqueeze, T.unsqueeze)

    @staticmethod
    def capture(b: Emitter, input: Any, dim: Any) -> Any:
        t = tensor_of(b.type_of(input))
        return b.emit("unsqueeze", [input], dim=dim_arg(dim, t.rank + 1))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dim: int) -> Type:
        t = tensor_of(x)
        if not 0 <= dim <= t.rank:
            raise ShapeError(f"unsqueeze dim {dim} out of range for rank {t.rank}")
        return t.replace(shape=(*t.shape[:dim], 1, *t.shape[dim:]))

    @staticmethod
    def reference(x: Any, *, dim: int) -> Any:
        return x.unsqueeze(dim)


class Squeeze(Op):
    """Removes ``dims``, each of size 1. torch skips dims that are not 1; the capture
    decides which are (an assumption for symbolic sizes) and records only those."""

    name = "squeeze"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.squeeze, T.squeeze)

    @staticmethod
    def capture(b: Emitter, input: Any, dim: Any = None) -> Any:
        t = tensor_of(b.type_of(input))
        candidates = dims_arg(dim, t.rank) if not (isinstance(dim, (tuple, list)) and len(dim) == 0) else ()
        if t.rank == 0:
            return input
        dims = tuple(d for d in candidates if is_one(b.ctx, t.shape[d], "squeeze of a possibly size-1 dim"))
        return b.emit("squeeze", [input], dims=dims) if dims else input

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dims: tuple[int, ...]) -> Type:
        t = tensor_of(x)
        for d in dims:
            if not 0 <= d < t.rank or not is_one(ctx, t.shape[d]):
                raise ShapeError(f"squeeze of dim {d}, which is not of size 1")
        return t.replace(shape=tuple(s for i, s in enumerate(t.shape) if i not in dims))

    @staticmethod
    def reference(x: Any, *, dims: tuple[int, ...]) -> Any:
        return x.squeeze(dims)


# -- broadcasting and tiling --------------------------------------------------------------
def expand_shape(ctx: ShapeContext, shape: Shape, sizes: tuple[Dim, ...]) -> Shape:
    new = len(sizes) - len(shape)
    if new < 0:
        raise ShapeError(f"expand to {len(sizes)} dims of a rank-{len(shape)} tensor")
    out: list[Dim] = []
    for i, s in enumerate(sizes):
        if i < new:
            if isinstance(s, int) and s < 0:
                raise ShapeError("expand: new leading dims need explicit sizes")
            out.append(s)
            continue
        d = shape[i - new]
        if (isinstance(s, int) and s == -1) or s == d:
            out.append(d)
        elif isinstance(d, int) and d == 1:
            out.append(s)
        # equality first, as broadcast_shapes prefers it: a dim that is 1 in the example
        # and equal to its target (a cache's batch of one) is not specialized to 1
        elif ctx.equal(d, s, "expand to an equal size"):
            out.append(d)
        elif is_one(ctx, d, "expand of a possibly size-1 dim"):
            out.append(s)
        else:
            raise ShapeError(f"expand of a non-unit dim: {d} != {s}")
    return tuple(out)


class Expand(Op):
    """Broadcast to ``shape`` (-1 keeps a dim); ``expand``, ``expand_as``, ``broadcast_to``."""

    name = "expand"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            T.expand,
            (
                T.expand_as,
                lambda b, input, other: b.emit("expand", [input], shape=tensor_of(b.type_of(other)).shape),
            ),
            (torch.broadcast_to, lambda b, input, size: Expand.capture(b, input, size)),
            (T.broadcast_to, lambda b, input, size: Expand.capture(b, input, size)),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, *sizes: Any, implicit: bool = False) -> Any:
        return b.emit("expand", [input], shape=tuple(_size(s) for s in size_args(sizes)))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, shape: tuple[Dim, ...]) -> Type:
        t = tensor_of(x)
        return t.replace(shape=expand_shape(ctx, t.shape, shape))

    @staticmethod
    def reference(x: Any, *, shape: tuple[int, ...]) -> Any:
        return x.expand(shape)


class Repeat(Op):
    """Tiles the tensor ``repeats[i]`` times along dim i (leading repeats add dims)."""

    name = "repeat"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (T.repeat,)

    @staticmethod
    def capture(b: Emitter, input: Any, *repeats: Any) -> Any:
        return b.emit("repeat", [input], repeats=tuple(size_arg(r) for r in size_args(repeats)))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, repeats: tuple[Dim, ...]) -> Type:
        t = tensor_of(x)
        if len(repeats) < t.rank:
            raise ShapeError(f"repeat needs at least {t.rank} repeat counts")
        shape = (1,) * (len(repeats) - t.rank) + t.shape
        return t.replace(shape=tuple(d * r for d, r in zip(shape, repeats)))

    @staticmethod
    def reference(x: Any, *, repeats: tuple[int, ...]) -> Any:
        return x.repeat(repeats)


class Flip(Op):
    name = "flip"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.flip, T.flip)

    @staticmethod
    def capture(b: Emitter, input: Any, *dims: Any) -> Any:
        t = tensor_of(b.type_of(input))
        norm = tuple(sorted({dim_arg(d, t.rank) for d in size_args(dims)}))
        return b.emit("flip", [input], dims=norm) if norm else input

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dims: tuple[int, ...]) -> Type:
        t = tensor_of(x)
        if any(not 0 <= d < max(t.rank, 1) for d in dims):
            raise ShapeError(f"flip dims {dims} out of range for rank {t.rank}")
        return t

    @staticmethod
    def reference(x: Any, *, dims: tuple[int, ...]) -> Any:
        return torch.flip(x, dims)
