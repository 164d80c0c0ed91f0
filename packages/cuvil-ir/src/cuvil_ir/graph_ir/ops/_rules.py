"""Shared pieces of op declarations: family declaration, broadcasting, promotion, dim handling,
and the capture-side handling of torch's arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.registry import CaptureRule, Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type, promote_types
from cuvil_ir.symbolic import Dim, Shape, ShapeContext, as_dim


class ShapeError(ValueError):
    """Operands whose shapes or dtypes the op cannot accept; ``hint`` (how to fix it)
    replaces the frontend's default hint when given."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


#: ``extern_reasons`` of ops that a library kernel runs best (see ``Op.extern_reasons``)
LIBRARY_KERNEL = "a library kernel (BLAS, oneDNN or torch's own, called as an extern) beats a loop nest"

#: the traits of ops whose output aliases (part of) their first input
VIEW = frozenset({"view", "pure"})


def declare(
    name: str,
    *,
    torch: Callable[[], Iterable[Any]],
    reference: Callable[..., Any],
    infer: Callable[..., Any] | None = None,
    capture: CaptureRule | None = None,
    traits: Iterable[str] | None = None,
    base: type[Op] = Op,
    decompose: Callable[..., Any] | None = None,
    **attrs: Any,
) -> type[Op]:
    """Declare op ``name`` from functions, as the family factories (``unary``, ``reduction`` ...) do.

    The class is named after the op (``log_softmax``: ``LogSoftmax``) and belongs to the
    module that defines ``reference``; ``infer``, ``capture``, ``traits`` and ``decompose``
    left out are inherited from ``base``; ``attrs`` are further class attributes
    (``num_outputs``, ``extern_reasons``).
    """
    ns: dict[str, Any] = {"__module__": reference.__module__, "name": name, **attrs}
    if traits is not None:
        ns["traits"] = frozenset(traits)
    fns = (("torch", torch), ("capture", capture), ("infer", infer), ("reference", reference))
    for key, fn in (*fns, ("decompose", decompose)):
        if fn is not None:
            ns[key] = staticmethod(fn)
    return type(name.title().replace("_", ""), (base,), ns)


def tensor_of(t: Type, what: str = "operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise ShapeError(f"{what} must be a tensor, got {t}")
    return t


def float_tensor(x: Type, what: str) -> TensorType:
    """An operand of an op that torch runs on float tensors only."""
    t = tensor_of(x)
    if not t.dtype.is_floating:
        raise ShapeError(f"{what} of a {t.dtype.value} tensor (torch takes float tensors)")
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
    """Numpy broadcasting over symbolic dims; facts that need deciding become assumptions.

    Equal dims never need a decision; otherwise the example sizes choose between
    "equal" and "one side is 1", preferring equality so that a dimension that
    happens to be 1 in the example is not specialised when it need not be.
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        result: Dim = 1
        for s in shapes:
            if len(s) - rank + i >= 0:
                result = _broadcast_dim(ctx, result, s[len(s) - rank + i], shapes)
        out.append(result)
    return tuple(out)


def _broadcast_dim(ctx: ShapeContext, a: Dim, b: Dim, shapes: tuple[Shape, ...]) -> Dim:
    if a == b or b == 1:
        return a
    if a == 1:
        return b
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"shapes {[tuple(map(str, s)) for s in shapes]} do not broadcast")
    if ctx.equal(a, b, "broadcast of equal dimensions"):
        return a
    if ctx.decide(sympy.Eq(b, 1), "broadcast of a size-1 dimension"):
        return a
    if ctx.decide(sympy.Eq(a, 1), "broadcast of a size-1 dimension"):
        return b
    raise ShapeError(f"shapes {[tuple(map(str, s)) for s in shapes]} do not broadcast")


def result_dtype(*types: Type) -> DType:
    """torch's type promotion (tensors, 0-d tensors and weak Python scalars); see
    :func:`~cuvil_ir.graph_ir.types.promote_types`."""
    try:
        return promote_types(*types)
    except ValueError as e:
        raise ShapeError(str(e)) from None


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


# -- sizes --------------------------------------------------------------------
def static_int(d: Any) -> int | None:
    """``d`` as an int when it is one (an int or a sympy Integer), else None."""
    if isinstance(d, bool):
        return None
    if isinstance(d, int):
        return d
    if isinstance(d, sympy.Basic) and d.is_Integer:
        return int(d)
    return None


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` on sizes; written ``floor(a/b)`` as the frontend writes ``//``."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return as_dim(sympy.floor(sympy.sympify(a) / b))


def ceildiv(a: Dim, b: Dim) -> Dim:
    """``ceil(a / b)`` for ``b > 0``, in the ``floor((a + b - 1)/b)`` form torch's kernels use,
    so that our sizes and the sizes of torch's fake kernels compare equal term by term."""
    return floordiv(a + b - 1, b)


def is_one(ctx: ShapeContext, d: Dim, reason: str = "size-1 dimension") -> bool:
    if isinstance(d, int):
        return d == 1
    return ctx.decide(sympy.Eq(d, 1), reason)


def check_equal(ctx: ShapeContext, a: Dim, b: Dim, what: str) -> None:
    if not ctx.equal(a, b, what):
        raise ShapeError(f"{what}: {a} != {b}")


def check_divisible(ctx: ShapeContext, n: Dim, k: Dim, what: str) -> None:
    if isinstance(n, int) and isinstance(k, int):
        ok = k != 0 and n % k == 0
    else:
        ok = ctx.decide(sympy.Eq(sympy.Mod(n, k), 0), what)
    if not ok:
        raise ShapeError(f"{what}: {n} is not divisible by {k}")


def same_dtype(what: str, *types: TensorType) -> DType:
    """Library kernels (matmul, conv ...) take operands of one dtype, without promotion."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"{what}: operands have different dtypes {sorted(d.value for d in dtypes)}")
    return types[0].dtype


# -- optional tensor inputs (a bias, affine parameters, a mask) -----------------
# They follow the required inputs, only when present; a ``has_<name>`` attribute per
# optional input says which ones are there, since a lone one could be either.
def optional_inputs(b: Emitter, **named: Any) -> tuple[list[Any], dict[str, bool]]:
    """The given ones of ``named`` (each a tensor or None), and their ``has_<name>`` attributes."""
    for k, v in named.items():
        if v is not None and not b.is_value(v):
            raise NotCaptured(f"{k} must be a tensor")
    return [v for v in named.values() if v is not None], {f"has_{k}": v is not None for k, v in named.items()}


def check_optional(
    ctx: ShapeContext,
    inputs: Sequence[Type],
    flags: Sequence[bool],
    shape: Sequence[Dim],
    what: str,
    noun: str = "parameter",
) -> None:
    """One input per set flag, each a tensor of ``shape``."""
    if len(inputs) != sum(flags):
        raise ShapeError(f"{what}: {len(inputs)} {noun} inputs for flags {tuple(flags)}")
    for p in inputs:
        t = tensor_of(p, f"{what} {noun}")
        if t.rank != len(shape):
            raise ShapeError(f"{what}: {noun} of rank {t.rank}, expected {len(shape)}")
        for a, e in zip(t.shape, shape):
            check_equal(ctx, a, e, f"{what} {noun} size")


def optional_args(inputs: Sequence[Any], **flags: bool) -> dict[str, Any]:
    """A reference's keyword arguments: the optional inputs by name, in order; None for absent ones."""
    it = iter(inputs)
    return {k: next(it) if flag else None for k, flag in flags.items()}


# -- capture-side argument handling (unusual arguments fall back to extern) ----
def size_args(args: Sequence[Any]) -> tuple[Any, ...]:
    """Sizes passed either as varargs (``x.view(2, 3)``) or as one sequence (``x.view((2, 3))``)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def size_arg(v: Any) -> Dim:
    """A size argument (int or size expression) as a canonical `Dim`."""
    if isinstance(v, bool) or not isinstance(v, (int, sympy.Basic)):
        raise NotCaptured(f"size argument {v!r} is not an int or a size expression")
    d = as_dim(v)
    if isinstance(d, sympy.Basic) and d.is_integer is False:
        raise NotCaptured(f"size argument {v!r} is not an integer")
    return d


def int_arg(v: Any, what: str = "argument") -> int:
    """An argument that must be a static int (a dim index, a group count ...)."""
    i = static_int(v)
    if i is None:
        raise NotCaptured(f"{what} must be a static int, got {v!r}")
    return i


def dim_arg(v: Any, rank: int) -> int:
    """A dim argument, normalised into [0, rank)."""
    try:
        return norm_dim(int_arg(v, "dim"), rank)
    except ShapeError as e:
        raise NotCaptured(str(e)) from None


def dims_arg(v: Any, rank: int) -> tuple[int, ...]:
    """Reduction dims (None, int or sequence; empty means all), normalised and sorted."""
    if v is None:
        return tuple(range(rank))
    seq = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    ints = [int_arg(d, "dim") for d in seq]
    try:
        return norm_dims(ints, rank)
    except ShapeError as e:
        raise NotCaptured(str(e)) from None


def dtype_arg(v: Any) -> DType | None:
    import torch

    if v is None:
        return None
    if isinstance(v, DType):
        return v
    if isinstance(v, torch.dtype):
        try:
            return DType.from_torch(v)
        except TypeError as e:
            raise NotCaptured(str(e)) from None
    raise NotCaptured(f"dtype argument {v!r} is not a torch.dtype")


def device_arg(v: Any) -> str | None:
    import torch

    if v is None:
        return None
    if isinstance(v, (str, torch.device)) or (isinstance(v, int) and not isinstance(v, bool)):
        return str(torch.device(v) if not isinstance(v, int) else torch.device("cuda", v))
    raise NotCaptured(f"device argument {v!r} is not a device")


def ntuple(v: Any, n: int, what: str) -> tuple[Any, ...]:
    """torch's ``_pair``/``_triple``: one value for every spatial dim, or one each."""
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return tuple(v) * n
        if len(v) != n:
            raise NotCaptured(f"{what} must have {n} elements, got {len(v)}")
        return tuple(v)
    return (v,) * n
