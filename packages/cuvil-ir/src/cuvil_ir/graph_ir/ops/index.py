"""Basic indexing and joining: slice, select, cat, split.

``x[...]`` with ints, slices, None and Ellipsis becomes a chain of select /
slice / unsqueeze ops (tensor indices are advanced indexing: not captured).
``stack``, ``narrow``, ``chunk``, ``unbind`` are written with these ops.

Slice bounds and indices keep torch's meaning in the IR (``None``, negative
values); shape rules normalise them, deciding signs and clamps of symbolic
bounds as assumptions, as torch's own symbolic shapes do.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.ops._rules import (
    VIEW,
    ShapeError,
    ceildiv,
    check_equal,
    device_of,
    dim_arg,
    floordiv,
    int_arg,
    result_dtype,
    size_arg,
    size_args,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import TensorType, Type
from cuvil_ir.symbolic import DataSizeError, Dim, ShapeContext, as_dim

T = torch.Tensor


def _lt(ctx: ShapeContext, a: Dim, b: Dim, reason: str) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return ctx.decide(sympy.Lt(a, b), reason)


def _at_most(ctx: ShapeContext, v: Dim, hi: Dim, reason: str) -> Dim:
    """``min(v, hi)``: decided when it can be, else (``v`` a size computed from tensor
    data, which has no example value) ``Min(v, hi)``, evaluated when the code runs."""
    if not (isinstance(v, int) and isinstance(hi, int)) and ctx.known(sympy.Le(v, hi)):
        return v  # v <= hi already known (a Min with hi among its arguments): no decision
    try:
        return v if _lt(ctx, v, hi, reason) else hi
    except DataSizeError:
        return as_dim(sympy.Min(v, hi))


def slice_bounds(ctx: ShapeContext, size: Dim, start: Dim | None, end: Dim | None) -> tuple[Dim, Dim]:
    """torch's slice normalisation: wrap negative bounds once, then clamp into [0, size], end >= start."""
    s = _start(ctx, size, start)
    if end is None:  # s <= size already
        return s, size
    e: Dim = end
    if _lt(ctx, e, 0, "negative slice end"):
        e = e + size
    e = _at_most(ctx, e, size, "slice end past the end")
    try:
        return s, (s if _lt(ctx, e, s, "empty slice") else e)
    except DataSizeError:
        return s, as_dim(sympy.Max(e, s))


def _start(ctx: ShapeContext, size: Dim, start: Dim | None) -> Dim:
    if start is None:
        return 0
    s: Dim = start
    if _lt(ctx, s, 0, "negative slice start"):
        s = s + size
        if not isinstance(start, int):  # s < size: start < 0
            return _last(ctx, s)
    if _lt(ctx, s, 0, "slice start before the beginning"):
        return 0
    return _at_most(ctx, s, size, "slice start past the end")


def _last(ctx: ShapeContext, s: Dim) -> Dim:
    """The start of ``x[-k:]`` for a symbolic ``k``, ``s = size - k`` (see the note).

    [Note: the last k of a size]
    ``x[-k:]`` keeps the last ``k`` rows, or all of them when there are fewer. With ``k``
    a size of its own (a sliding window's ``-self.sliding_window + 1``), which side of
    that clamp a call is on changes from call to call (the window fills as a decoder
    generates), so deciding it as an assumption compiled one variant per side. The start
    is ``Max(size - k, 0)`` instead, decided per call when sizes are bound; a start whose
    side is already known (proved, or assumed before) is used as it is. A constant
    ``k`` (``x[-1:]``) is still decided: a clamp against a constant is the same for all
    but the smallest sizes, and its result stays the constant.
    """
    known = ctx.known(sympy.Lt(s, 0))
    if known is None:
        return as_dim(sympy.Max(s, 0))
    return 0 if known else s


class Slice(Op):
    name = "slice"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (T.__getitem__, (torch.narrow, _narrow), (T.narrow, _narrow))

    @staticmethod
    def capture(b: Emitter, input: Any, key: Any) -> Any:
        return getitem(b, input, key)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dim: int, start: Dim | None, end: Dim | None, step: int) -> Type:
        t = tensor_of(x)
        if not 0 <= dim < t.rank or step < 1:
            raise ShapeError(f"slice of dim {dim} (rank {t.rank}) with step {step}")
        s, e = slice_bounds(ctx, t.shape[dim], start, end)
        length = floordiv(e - s + step - 1, step)
        return t.replace(shape=(*t.shape[:dim], length, *t.shape[dim + 1 :]))

    @staticmethod
    def reference(x: Any, *, dim: int, start: int | None, end: int | None, step: int) -> Any:
        return x[(slice(None),) * dim + (slice(start, end, step),)]


def _bound(v: Any) -> Dim | None:
    return None if v is None else size_arg(v)


def getitem(b: Emitter, x: Any, key: Any) -> Any:
    items = key if isinstance(key, tuple) else (key,)
    for it in items:
        if b.is_value(it) or isinstance(it, (bool, list, tuple, float)):
            raise NotCaptured("advanced indexing (tensor, bool or list indices)")
    rank = tensor_of(b.type_of(x)).rank
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consuming > rank or sum(1 for it in items if it is Ellipsis) > 1:
        raise NotCaptured("too many indices")
    if Ellipsis in items:  # `in` compares with ==, harmless for ints, slices and None
        i = next(j for j, it in enumerate(items) if it is Ellipsis)
        items = (*items[:i], *(slice(None),) * (rank - consuming), *items[i + 1 :])
    d = 0
    for it in items:
        if it is None:
            x = b.emit("unsqueeze", [x], dim=d)
            d += 1
        elif isinstance(it, slice):
            step = 1 if it.step is None else int_arg(it.step, "slice step")
            if step <= 0:
                raise NotCaptured("slice step must be positive")
            start, end = _bound(it.start), _bound(it.stop)
            if not (start in (None, 0) and end is None and step == 1):
                x = b.emit("slice", [x], dim=d, start=start, end=end, step=step)
            d += 1
        else:
            x = b.emit("select", [x], dim=d, index=size_arg(it))
    return x


def _narrow(b: Emitter, input: Any, dim: Any, start: Any, length: Any) -> Any:
    t = tensor_of(b.type_of(input))
    d = dim_arg(dim, t.rank)
    if b.is_value(start):
        raise NotCaptured("narrow with a tensor start")
    s, n = size_arg(start), size_arg(length)
    if _lt(b.ctx, s, 0, "negative narrow start"):
        s = s + t.shape[d]
    # torch raises where a slice would clamp; keep that error on the extern path
    if _lt(b.ctx, t.shape[d], s + n, "narrow past the end"):
        raise NotCaptured("narrow past the end of the dim")
    return b.emit("slice", [input], dim=d, start=s, end=s + n, step=1)


class Select(Op):
    """``x.select(dim, index)``: the dim disappears; a negative index counts from the end."""

    name = "select"
    traits = VIEW

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.select, T.select, (torch.unbind, _unbind), (T.unbind, _unbind))

    @staticmethod
    def capture(b: Emitter, input: Any, dim: Any, index: Any) -> Any:
        t = tensor_of(b.type_of(input))
        return b.emit("select", [input], dim=dim_arg(dim, t.rank), index=size_arg(index))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dim: int, index: Dim) -> Type:
        t = tensor_of(x)
        if not 0 <= dim < t.rank:
            raise ShapeError(f"select of dim {dim} for rank {t.rank}")
        size = t.shape[dim]
        i = index + size if _lt(ctx, index, 0, "negative index") else index
        if _lt(ctx, i, 0, "index before the beginning") or not _lt(ctx, i, size, "index in range"):
            raise ShapeError(f"index {index} out of range for size {size}")
        return t.replace(shape=(*t.shape[:dim], *t.shape[dim + 1 :]))

    @staticmethod
    def reference(x: Any, *, dim: int, index: int) -> Any:
        return x.select(dim, index)


def _count(b: Emitter, n: Dim, reason: str) -> int:
    """A count of outputs (a Python-level number): specialised when symbolic."""
    if isinstance(n, int):
        return n
    if b.ctx.hints is None:
        raise NotCaptured("a symbolic number of outputs needs example sizes")
    k = b.ctx.hint(n)
    b.ctx.decide(sympy.Eq(n, k), reason)
    return k


def _unbind(b: Emitter, input: Any, dim: Any = 0) -> Any:
    t = tensor_of(b.type_of(input))
    d = dim_arg(dim, t.rank)
    k = _count(b, t.shape[d], "unbind: number of slices")
    return tuple(b.emit("select", [input], dim=d, index=i) for i in range(k))


# -- joining ------------------------------------------------------------------------------
class Cat(Op):
    name = "cat"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.cat, torch.concat, torch.concatenate, (torch.stack, _stack))

    @staticmethod
    def capture(b: Emitter, tensors: Any, dim: Any = 0, *, axis: Any = None, out: Any = None) -> Any:
        if out is not None or not isinstance(tensors, (tuple, list)) or not tensors:
            raise NotCaptured("out=, or not a non-empty sequence of tensors")
        if axis is not None:
            dim = axis
        types = [tensor_of(b.type_of(h)) for h in tensors]
        if any(t.rank != types[0].rank for t in types):
            raise NotCaptured("cat of tensors of different ranks (legacy empty-tensor rule)")
        return b.emit("cat", list(tensors), dim=dim_arg(dim, types[0].rank))

    @staticmethod
    def infer(ctx: ShapeContext, *inputs: Type, dim: int) -> Type:
        types = [tensor_of(t) for t in inputs]
        if not types or any(t.rank != types[0].rank for t in types) or not 0 <= dim < types[0].rank:
            raise ShapeError(f"cat along dim {dim} of ranks {[t.rank for t in types]}")
        first = types[0]
        for t in types[1:]:
            for i, (a, c) in enumerate(zip(first.shape, t.shape)):
                if i != dim:
                    check_equal(ctx, a, c, "cat: sizes off the joined dim")
        total: Any = sum((t.shape[dim] for t in types[1:]), first.shape[dim])
        shape = (*first.shape[:dim], total, *first.shape[dim + 1 :])
        return TensorType(result_dtype(*types), shape, device_of(*types))

    @staticmethod
    def reference(*inputs: Any, dim: int) -> Any:
        return torch.cat(inputs, dim)


def _stack(b: Emitter, tensors: Any, dim: Any = 0, *, out: Any = None) -> Any:
    if out is not None or not isinstance(tensors, (tuple, list)) or not tensors:
        raise NotCaptured("out=, or not a non-empty sequence of tensors")
    d = dim_arg(dim, tensor_of(b.type_of(tensors[0])).rank + 1)
    return b.emit("cat", [b.emit("unsqueeze", [t], dim=d) for t in tensors], dim=d)


# -- splitting ----------------------------------------------------------------------------
class Split(Op):
    """Consecutive pieces of ``sizes`` along ``dim``; one output per piece."""

    name = "split"
    traits = VIEW
    num_outputs = None

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.split,
            T.split,
            (torch.split_with_sizes, _split_sizes),
            (T.split_with_sizes, _split_sizes),
            (torch.chunk, _chunk),
            (T.chunk, _chunk),
        )

    @staticmethod
    def capture(b: Emitter, tensor: Any, split_size_or_sections: Any, dim: Any = 0) -> Any:
        if isinstance(split_size_or_sections, (tuple, list)):
            return _split_sizes(b, tensor, split_size_or_sections, dim)
        t = tensor_of(b.type_of(tensor))
        d = dim_arg(dim, t.rank)
        size = size_arg(split_size_or_sections)
        n = t.shape[d]
        if isinstance(size, int) and size <= 0:
            raise NotCaptured("split size must be positive")
        return _pieces(b, tensor, d, n, size, "split: number of pieces")

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dim: int, sizes: tuple[Dim, ...]) -> tuple[Type, ...]:
        t = tensor_of(x)
        if not 0 <= dim < t.rank or not sizes:
            raise ShapeError(f"split of dim {dim} (rank {t.rank}) into {len(sizes)} pieces")
        check_equal(ctx, sum(sizes[1:], sizes[0]), t.shape[dim], "split sizes add up to the dim")
        return tuple(t.replace(shape=(*t.shape[:dim], s, *t.shape[dim + 1 :])) for s in sizes)

    @staticmethod
    def reference(x: Any, *, dim: int, sizes: tuple[int, ...]) -> Any:
        return tuple(torch.split(x, list(sizes), dim))


def _pieces(b: Emitter, x: Any, d: int, n: Dim, size: Dim, reason: str) -> Any:
    """Pieces of ``size`` (the last one shorter), as torch.split; the count is specialised."""
    if isinstance(size, int) and size == 0:
        raise NotCaptured("split of an empty dim")
    k = max(_count(b, ceildiv(n, size), reason), 1)
    sizes = (size,) * (k - 1) + (n - (k - 1) * size,)
    return b.emit("split", [x], dim=d, sizes=sizes)


def _split_sizes(b: Emitter, tensor: Any, split_sizes: Any, dim: Any = 0) -> Any:
    t = tensor_of(b.type_of(tensor))
    return b.emit(
        "split",
        [tensor],
        dim=dim_arg(dim, t.rank),
        sizes=tuple(size_arg(s) for s in size_args((split_sizes,))),
    )


def _chunk(b: Emitter, input: Any, chunks: Any, dim: Any = 0) -> Any:
    t = tensor_of(b.type_of(input))
    d = dim_arg(dim, t.rank)
    c = int_arg(chunks, "chunks")
    if c <= 0:
        raise NotCaptured("chunks must be positive")
    n = t.shape[d]
    # torch: an empty dim gives `chunks` empty pieces; else pieces of ceil(n / chunks),
    # so fewer than `chunks` pieces can come out
    if n == 0 or (not isinstance(n, int) and b.ctx.decide(sympy.Eq(n, 0), "chunk of an empty dim")):
        return b.emit("split", [input], dim=d, sizes=(0,) * c)
    size = ceildiv(n, c)
    # the count as a guard must be defined at n = 0 too (a call of another size checks it)
    count = ceildiv(n, size) if isinstance(size, int) else ceildiv(n, sympy.Max(size, 1))
    k = max(_count(b, count, "chunk: number of pieces"), 1)
    return b.emit("split", [input], dim=d, sizes=(size,) * (k - 1) + (n - (k - 1) * size,))
