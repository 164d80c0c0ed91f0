"""Reductions (sum, mean, amax, var ...), arg-reductions, max/min with indices, and scans.

Reduced axes are recorded as ``dims``: normalised (non-negative, sorted) and
explicit, so "all axes" never hides behind ``None`` or ``()`` in the IR.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.decompose import Builder, NotDecomposed, Sym, where
from cuvil_ir.graph_ir.ops._rules import (
    ShapeError,
    declare,
    dim_arg,
    dims_arg,
    dtype_arg,
    float_dtype,
    float_tensor,
    numel,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import Shape, ShapeContext

T = torch.Tensor
_REDUCTION = frozenset({"reduction", "pure"})
#: reductions without an identity element: eager refuses an empty reduced dim
_NO_IDENTITY = frozenset({"amax", "amin"})
#: why the reductions that also return an index are externs on the Tensor IR level
_WITH_INDEX = "Reduce has no arg-reduction kind (the index of the extremum) yet"


def _check_dims(t: TensorType, dims: tuple[int, ...]) -> None:
    limit = max(t.rank, 1)  # a 0-d tensor accepts dim 0 (torch wraps it)
    if any(not 0 <= d < limit for d in dims) or len(set(dims)) != len(dims):
        raise ShapeError(f"bad reduction dims {dims} for rank {t.rank}")


def reduced_shape(t: TensorType, dims: tuple[int, ...], keepdim: bool) -> Shape:
    _check_dims(t, dims)
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(t.shape))
    return tuple(d for i, d in enumerate(t.shape) if i not in dims)


def _plain(out: Any, keepdim: Any) -> None:
    """Reductions capture the plain form: no ``out=``, and ``keepdim`` a Python bool."""
    if out is not None or not isinstance(keepdim, bool):
        raise NotCaptured("out= or a non-bool keepdim")


def nonempty(b: Emitter, name: str, t: TensorType, dims: tuple[int, ...], whole: bool) -> None:
    """An extremum (``amax``, ``amin``, ``max``, ``min``) has no identity: eager raises on
    an empty reduced dim instead of returning +-inf. Each reduced size is decided
    (``Ne(size, 0)`` becomes a size guard when it is symbolic), so a call with an empty
    one captures again and is refused here, as eager refuses it."""
    for d in dims:
        if d >= t.rank:
            continue  # dim 0 (or -1) of a 0-d tensor, which torch allows: one element
        size = t.shape[d]
        empty = (
            size == 0
            if isinstance(size, int)
            else b.ctx.decide(sympy.Eq(size, 0), f"{name}() over a dimension eager requires to be non-empty")
        )
        if empty:
            if whole:
                raise ShapeError(
                    f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                    "Specify the reduction dim with the 'dim' argument."
                )
            raise ShapeError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


# -- dtype rules -----------------------------------------------------------------
def _accumulate(t: TensorType, dtype: DType | None) -> DType:
    """sum/prod/cumsum: integers and bools accumulate in int64."""
    if dtype is not None:
        return dtype
    return DType.i64 if (t.dtype.is_integer or t.dtype == DType.bool) else t.dtype


def _floating(t: TensorType, dtype: DType | None) -> DType:
    """mean: the result dtype must be floating (or complex); torch does not promote ints."""
    out = dtype or t.dtype
    if not (out.is_floating or out.is_complex):
        raise ShapeError(f"mean of a {t.dtype.value} tensor needs a floating dtype=")
    return out


def _same(t: TensorType, dtype: DType | None) -> DType:
    return t.dtype


def _truth(t: TensorType, dtype: DType | None) -> DType:
    return DType.u8 if t.dtype == DType.u8 else DType.bool  # all/any keep uint8 (legacy)


def _log(t: TensorType, dtype: DType | None) -> DType:
    return float_dtype(t.dtype)


def reduction(
    name: str,
    fns: Callable[[], tuple[Any, ...]],
    ref: Callable[..., Any],
    dtype_rule: Callable[[TensorType, DType | None], DType],
    *,
    with_dtype: bool = False,
    dim_default: Any = None,
    decompose: Callable[..., Any] | None = None,
) -> type[Op]:
    """Declare ``name(x) {dims, keepdim[, dtype]}``; ``with_dtype`` ops take torch's ``dtype=``;
    a composite reduction gives its ``decompose``."""

    def capture(
        b: Emitter,
        input: Any,
        dim: Any = dim_default,
        keepdim: bool = False,
        *,
        dtype: Any = None,
        out: Any = None,
    ) -> Any:
        _plain(out, keepdim)
        if dtype is not None and not with_dtype:
            raise NotCaptured(f"{name} takes no dtype")
        t = tensor_of(b.type_of(input))
        extra = {"dtype": dtype_arg(dtype)} if with_dtype else {}
        dims = dims_arg(dim, t.rank)
        if name in _NO_IDENTITY:
            nonempty(b, name, t, dims, whole=dim is None or dim == () or dim == [])
        return b.emit(name, [input], dims=dims, keepdim=keepdim, **extra)

    if with_dtype:

        def infer(
            ctx: ShapeContext, x: Type, *, dims: tuple[int, ...], keepdim: bool, dtype: DType | None
        ) -> Type:
            t = tensor_of(x)
            return TensorType(dtype_rule(t, dtype), reduced_shape(t, dims, keepdim), t.device)

        def reference(x: Any, *, dims: tuple[int, ...], keepdim: bool, dtype: DType | None) -> Any:
            return ref(x, dims, keepdim, dtype.torch if dtype is not None else None)
    else:

        def infer(ctx: ShapeContext, x: Type, *, dims: tuple[int, ...], keepdim: bool) -> Type:  # type: ignore[misc]
            t = tensor_of(x)
            return TensorType(dtype_rule(t, None), reduced_shape(t, dims, keepdim), t.device)

        def reference(x: Any, *, dims: tuple[int, ...], keepdim: bool) -> Any:  # type: ignore[misc]
            return ref(x, dims, keepdim)

    return declare(
        name,
        traits=_REDUCTION,
        torch=fns,
        capture=capture,
        infer=infer,
        reference=reference,
        decompose=decompose,
    )


def _prod(x: Any, dims: tuple[int, ...], keepdim: bool, dtype: Any) -> Any:
    # torch.prod reduces one dim at a time
    if not dims:
        return torch.prod(x, dtype=dtype)
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim, dtype=dtype)
    return x


reduction(
    "sum",
    lambda: (torch.sum, T.sum),
    lambda x, d, k, dt: torch.sum(x, d, k, dtype=dt),
    _accumulate,
    with_dtype=True,
)
reduction(
    "mean",
    lambda: (torch.mean, T.mean),
    lambda x, d, k, dt: torch.mean(x, d, k, dtype=dt),
    _floating,
    with_dtype=True,
)
reduction("prod", lambda: (torch.prod, T.prod), _prod, _accumulate, with_dtype=True)
reduction("amax", lambda: (torch.amax, T.amax), lambda x, d, k: torch.amax(x, d, k), _same, dim_default=())
reduction("amin", lambda: (torch.amin, T.amin), lambda x, d, k: torch.amin(x, d, k), _same, dim_default=())
reduction("all", lambda: (torch.all, T.all), lambda x, d, k: torch.all(x, d, k), _truth)
reduction("any", lambda: (torch.any, T.any), lambda x, d, k: torch.any(x, d, k), _truth)


def _logsumexp(b: Builder, x: Sym, *, dims: tuple[int, ...], keepdim: bool) -> Sym:
    x = x.cast(tensor_of(b.out_type()).dtype) if not x.dtype.is_floating else x  # ints: in f32
    m = x.amax(dims, keepdim=True)
    safe = where(m.abs().eq(math.inf), 0.0, m)  # a row of -inf: x - m would be nan
    s = (x - safe).exp().sum(dims, keepdim=keepdim)
    return s.log() + (safe if keepdim or not dims else b.op("squeeze", safe, dims=dims))


reduction(
    "logsumexp",
    lambda: (torch.logsumexp, T.logsumexp, torch.special.logsumexp),
    lambda x, d, k: torch.logsumexp(x, d, k),
    _log,
    decompose=_logsumexp,
)


# -- variance and standard deviation -------------------------------------------------
def _moment_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, bool]:
    """(dim, correction, keepdim) from any of torch's var/std call forms:
    ``var(x, dim, *, correction, keepdim)``, ``var(x, dim, unbiased, keepdim)``, ``var(x, unbiased)``."""
    kwargs = dict(kwargs)
    if kwargs.pop("out", None) is not None:
        raise NotCaptured("out=")
    dim, unbiased, keepdim = (
        kwargs.pop("dim", None),
        kwargs.pop("unbiased", None),
        kwargs.pop("keepdim", False),
    )
    correction = kwargs.pop("correction", None)
    if kwargs:
        raise NotCaptured(f"unknown arguments {sorted(kwargs)}")
    rest = list(args)
    if rest and isinstance(rest[0], bool):
        unbiased = rest.pop(0)
    elif rest:
        dim = rest.pop(0)
        if rest:
            unbiased = rest.pop(0)
        if rest:
            keepdim = rest.pop(0)
    if rest:
        raise NotCaptured("too many arguments")
    if unbiased is not None:
        if correction is not None:
            raise NotCaptured("both unbiased and correction")
        correction = 1 if unbiased else 0
    if correction is None:
        correction = 1
    if (
        isinstance(correction, bool)
        or not isinstance(correction, (int, float))
        or not isinstance(keepdim, bool)
    ):
        raise NotCaptured("correction must be a number and keepdim a bool")
    return dim, correction, keepdim


def _moment(name: str, fns: Callable[[], tuple[Any, ...]], fn: Callable[..., Any]) -> type[Op]:
    def capture(b: Emitter, input: Any, *args: Any, **kwargs: Any) -> Any:
        dim, correction, keepdim = _moment_args(args, kwargs)
        t = tensor_of(b.type_of(input))
        return b.emit(name, [input], dims=dims_arg(dim, t.rank), correction=correction, keepdim=keepdim)

    def with_mean(b: Emitter, input: Any, *args: Any, **kwargs: Any) -> Any:
        dim, correction, keepdim = _moment_args(args, kwargs)
        dims = dims_arg(dim, tensor_of(b.type_of(input)).rank)
        spread = b.emit(name, [input], dims=dims, correction=correction, keepdim=keepdim)
        return spread, b.emit("mean", [input], dims=dims, keepdim=keepdim, dtype=None)

    def infer(
        ctx: ShapeContext, x: Type, *, dims: tuple[int, ...], correction: int | float, keepdim: bool
    ) -> Type:
        t = tensor_of(x)
        if t.dtype.is_complex:
            dtype = DType.f32 if t.dtype == DType.c64 else DType.f64
        else:
            dtype = float_tensor(t, name).dtype
        return TensorType(dtype, reduced_shape(t, dims, keepdim), t.device)

    def reference(x: Any, *, dims: tuple[int, ...], correction: int | float, keepdim: bool) -> Any:
        return fn(x, dim=dims, correction=correction, keepdim=keepdim)

    def decompose(
        b: Builder, x: Sym, *, dims: tuple[int, ...], correction: int | float, keepdim: bool
    ) -> Sym:
        """Two-pass: squared deviations from the mean, summed, over ``max(0, n - correction)``."""
        if not x.dtype.is_floating:
            raise NotDecomposed(f"{name} of a {x.dtype.value} tensor")
        n = numel(tuple(x.shape[d] for d in dims))
        denom: Any = n - correction
        denom = max(denom, 0) if isinstance(denom, (int, float)) else sympy.Max(denom, 0)
        centred = x - x.mean(dims, keepdim=True)
        v = (centred * centred).sum(dims, keepdim=keepdim) / b.const(denom)
        return v.sqrt() if name == "std" else v

    mean_fns = {"var": (torch.var_mean,), "std": (torch.std_mean,)}[name]
    return declare(
        name,
        traits=_REDUCTION,
        torch=lambda: (*fns(), *((f, with_mean) for f in mean_fns)),
        capture=capture,
        infer=infer,
        reference=reference,
        decompose=decompose,
    )


_moment("var", lambda: (torch.var, T.var), torch.var)
_moment("std", lambda: (torch.std, T.std), torch.std)


# -- max/min along a dim (values and indices), arg-reductions ---------------------------
def _extremum(name: str, fns: Callable[[], tuple[Any, ...]], fn: Any, whole: str, pairwise: str) -> type[Op]:
    result_type = getattr(torch.return_types, name)

    def capture(b: Emitter, input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> Any:
        _plain(out, keepdim)
        t = tensor_of(b.type_of(input))
        if dim is None:  # max(x): one value over all elements
            nonempty(b, name, t, dims_arg(None, t.rank), whole=True)
            return b.emit(whole, [input], dims=dims_arg(None, t.rank), keepdim=False)
        if b.is_value(dim):  # max(x, other): elementwise
            return b.emit(pairwise, [input, dim])
        if t.rank:
            nonempty(b, name, t, (dim_arg(dim, t.rank),), whole=False)
        values, indices = b.emit(name, [input], dim=dim_arg(dim, t.rank), keepdim=keepdim)
        # a structseq, so that `.values` / `.indices` work as they do on torch's result
        return result_type((values, indices))

    def infer(ctx: ShapeContext, x: Type, *, dim: int, keepdim: bool) -> tuple[Type, Type]:
        t = tensor_of(x)
        shape = reduced_shape(t, (dim,), keepdim)
        return TensorType(t.dtype, shape, t.device), TensorType(DType.i64, shape, t.device)

    def reference(x: Any, *, dim: int, keepdim: bool) -> Any:
        return tuple(fn(x, dim, keepdim))

    return declare(
        name,
        traits=_REDUCTION,
        torch=fns,
        capture=capture,
        infer=infer,
        reference=reference,
        num_outputs=2,
        extern_reasons={"tensor_ir": _WITH_INDEX},
    )


_extremum("max", lambda: (torch.max, T.max), torch.max, "amax", "maximum")
_extremum("min", lambda: (torch.min, T.min), torch.min, "amin", "minimum")


def _arg_reduction(name: str, fns: Callable[[], tuple[Any, ...]], fn: Any) -> type[Op]:
    def capture(b: Emitter, input: Any, dim: Any = None, keepdim: bool = False, *, out: Any = None) -> Any:
        _plain(out, keepdim)
        t = tensor_of(b.type_of(input))
        return b.emit(name, [input], dim=None if dim is None else dim_arg(dim, t.rank), keepdim=keepdim)

    def infer(ctx: ShapeContext, x: Type, *, dim: int | None, keepdim: bool) -> Type:
        t = tensor_of(x)
        if t.dtype == DType.bool or t.dtype.is_complex:
            raise ShapeError(f"{name} of a {t.dtype.value} tensor")
        if dim is None:  # the index into the flattened tensor
            shape: Shape = (1,) * t.rank if keepdim else ()
        else:
            shape = reduced_shape(t, (dim,), keepdim)
        return TensorType(DType.i64, shape, t.device)

    def reference(x: Any, *, dim: int | None, keepdim: bool) -> Any:
        return fn(x, dim, keepdim)

    return declare(
        name,
        traits=_REDUCTION,
        torch=fns,
        capture=capture,
        infer=infer,
        reference=reference,
        extern_reasons={"tensor_ir": _WITH_INDEX},
    )


_arg_reduction("argmax", lambda: (torch.argmax, T.argmax), torch.argmax)
_arg_reduction("argmin", lambda: (torch.argmin, T.argmin), torch.argmin)


# -- scans ---------------------------------------------------------------------------
def _scan(name: str, fns: Callable[[], tuple[Any, ...]], fn: Any) -> type[Op]:
    def capture(b: Emitter, input: Any, dim: Any, *, dtype: Any = None, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        t = tensor_of(b.type_of(input))
        return b.emit(name, [input], dim=dim_arg(dim, t.rank), dtype=dtype_arg(dtype))

    def infer(ctx: ShapeContext, x: Type, *, dim: int, dtype: DType | None) -> Type:
        t = tensor_of(x)
        _check_dims(t, (dim,))
        return t.replace(dtype=_accumulate(t, dtype))

    def reference(x: Any, *, dim: int, dtype: DType | None) -> Any:
        return fn(x, dim, dtype=dtype.torch if dtype is not None else None)

    reasons = {
        "tensor_ir": "a scan carries each element into the next: no Reduce expresses it",
        "mlir": "a scan is not written in linalg yet",
    }
    if name == "cumprod":
        reasons["onnx"] = "ONNX has CumSum but no cumulative product"
    return declare(
        name,
        traits={"scan", "pure"},
        torch=fns,
        capture=capture,
        infer=infer,
        reference=reference,
        extern_reasons=reasons,
    )


_scan("cumsum", lambda: (torch.cumsum, T.cumsum), torch.cumsum)
_scan("cumprod", lambda: (torch.cumprod, T.cumprod), torch.cumprod)
