"""Elementwise ops: broadcasting, torch type promotion, one declaration each.

Families share their rules through :func:`unary` and :func:`binary`, which
declare an :class:`Op` subclass (as JAX's ``standard_unop`` does); ops that do
not fit a family are written out as classes below.
"""

from __future__ import annotations

from collections.abc import Callable
from types import EllipsisType
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.decompose import Builder, Sym, where
from cuvil_ir.graph_ir.ops._rules import (
    ShapeError,
    broadcast_shapes,
    declare,
    device_arg,
    device_of,
    dtype_arg,
    float_dtype,
    result_dtype,
    size_arg,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, ScalarType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

T = torch.Tensor
_ELEMENTWISE = frozenset({"elementwise", "pure"})


def _elementwise_type(ctx: ShapeContext, inputs: tuple[Type, ...], dtype: DType) -> TensorType:
    shapes = [t.shape for t in inputs if isinstance(t, TensorType)]
    return TensorType(dtype, broadcast_shapes(ctx, *shapes), device_of(*inputs))


def _refuse_bool_like_eager(name: str, ref: Callable[[Any], Any]) -> None:
    """Eager refuses many unary ops on a bool tensor (``abs``, ``neg``, ``floor``, ``relu``,
    ``silu``, ...) while their lowerings would happily compute on 0/1. Which ones is eager's
    business, so ask it: the op's own reference runs on a one-element bool tensor, and its
    error (eager's exact message) refuses the capture."""
    try:
        ref(torch.zeros(1, dtype=torch.bool))
    except (RuntimeError, NotImplementedError) as e:
        raise ShapeError(
            f"{name}() on a bool tensor: {e}",
            hint="torch refuses this op on bool too: convert first (x.long(), x.float()), or use ~x for a mask",
        ) from None


def unary(
    name: str,
    fns: Callable[[], tuple[Any, ...]],
    ref: Callable[[Any], Any],
    *,
    floating: bool = False,
    to_bool: bool = False,
    decompose: Callable[..., Any] | None = None,
    scalar: str | None | EllipsisType = ...,
) -> type[Op]:
    """Declare ``name(x)``; ``floating`` ops turn integer inputs into f32; a composite op
    gives its ``decompose`` (see :mod:`cuvil_ir.graph_ir.decompose`). ``scalar``: the
    Tensor IR function of one element (:attr:`Op.scalar`); by default the op's name for
    a primitive, none for a composite."""
    if scalar is ...:
        scalar = name if decompose is None else None

    def infer(ctx: ShapeContext, x: Type) -> Type:
        t = tensor_of(x)
        dtype = DType.bool if to_bool else (float_dtype(t.dtype) if floating else t.dtype)
        return t.replace(dtype=dtype)

    def capture(b: Emitter, input: Any, inplace: bool = False, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out= is not captured")
        t = b.type_of(input) if b.is_value(input) else None
        if isinstance(t, TensorType) and t.dtype == DType.bool:
            _refuse_bool_like_eager(name, ref)
        result = b.emit(name, [input])
        return b.rebind(input, result) if inplace else result

    def reference(x: Any) -> Any:
        return ref(x)

    return declare(
        name,
        traits=_ELEMENTWISE,
        torch=fns,
        capture=capture,
        infer=infer,
        reference=reference,
        decompose=decompose,
        scalar=scalar,
    )


def binary(
    name: str,
    fns: Callable[[], tuple[Any, ...]],
    ref: Callable[[Any, Any], Any],
    *,
    reflected: Callable[[], tuple[Any, ...]] = tuple,
    compare: bool = False,
    true_div: bool = False,
    tensors_only: bool = False,
    scalar: str | None | EllipsisType = ...,
) -> type[Op]:
    """Declare ``name(a, b)`` with broadcasting; ``reflected`` callables swap operands;
    ``tensors_only`` ops (torch.maximum ...) take no Python scalar operand. ``scalar``:
    the Tensor IR function of two elements (:attr:`Op.scalar`), by default the op's name."""
    if scalar is ...:
        scalar = name

    def infer(ctx: ShapeContext, a: Type, b: Type) -> Type:
        if isinstance(a, ScalarType) and isinstance(b, ScalarType):
            raise ValueError(f"{name}: at least one operand must be a tensor")
        if tensors_only and (isinstance(a, ScalarType) or isinstance(b, ScalarType)):
            raise ValueError(f"{name}: both operands must be tensors")
        dtype = result_dtype(a, b)
        if compare:
            dtype = DType.bool
        elif true_div:
            dtype = float_dtype(dtype)
        return _elementwise_type(ctx, (a, b), dtype)

    def capture(b: Emitter, input: Any, other: Any, *, alpha: Any = 1, out: Any = None) -> Any:
        if out is not None or alpha != 1:
            raise NotCaptured("only the plain form is captured")
        if tensors_only and not (b.is_value(input) and b.is_value(other)):
            raise NotCaptured(f"torch.{name} takes tensors only; torch reports the error")
        return b.emit(name, [input, other])

    def capture_reflected(b: Emitter, input: Any, other: Any) -> Any:
        return b.emit(name, [other, input])

    def reference(a: Any, b: Any) -> Any:
        return ref(a, b)

    return declare(
        name,
        traits=_ELEMENTWISE,
        torch=lambda: (*fns(), *((f, capture_reflected) for f in reflected())),
        capture=capture,
        infer=infer,
        reference=reference,
        scalar=scalar,
    )


def _where_capture(b: Emitter, condition: Any, input: Any, other: Any, *, out: Any = None) -> Any:
    if out is not None:
        raise NotCaptured("out=")
    return b.emit("where", [condition, input, other])


def _masked_fill_capture(b: Emitter, input: Any, mask: Any, value: Any) -> Any:
    x = tensor_of(b.type_of(input))
    m = tensor_of(b.type_of(mask))
    if m.dtype != DType.bool:
        raise NotCaptured("masked_fill needs a bool mask")
    if broadcast_shapes(b.ctx, x.shape, m.shape) != x.shape:
        raise NotCaptured("the mask of masked_fill must broadcast to the filled tensor")
    filled = b.emit("where", [mask, value, input])
    if tensor_of(b.type_of(filled)).dtype != x.dtype:
        filled = b.emit("cast", [filled], dtype=x.dtype)
    return filled


class Where(Op):
    name = "where"
    traits = _ELEMENTWISE

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.where,
            # x.where(cond, y) is where(cond, x, y): self is the value, not the condition
            (T.where, lambda b, self, condition, y: _where_capture(b, condition, self, y)),
            # masked_fill is a where that keeps the dtype of the filled tensor
            (torch.masked_fill, _masked_fill_capture),
            (T.masked_fill, _masked_fill_capture),
        )

    @staticmethod
    def capture(b: Emitter, condition: Any, input: Any = None, other: Any = None, **kw: Any) -> Any:
        if input is None or other is None:
            raise NotCaptured("torch.where(cond) returns data-dependent indices")
        return _where_capture(b, condition, input, other, **kw)

    @staticmethod
    def infer(ctx: ShapeContext, cond: Type, a: Type, b: Type) -> Type:
        dtype = result_dtype(a, b) if isinstance(a, TensorType) or isinstance(b, TensorType) else DType.f32
        return _elementwise_type(ctx, (cond, a, b), dtype)

    @staticmethod
    def reference(cond: Any, a: Any, b: Any) -> Any:
        return torch.where(cond, a, b)


# -- binary arithmetic and comparisons ------------------------------------
binary("add", lambda: (torch.add, T.add, T.__add__), torch.add, reflected=lambda: (T.__radd__,))
binary(
    "sub", lambda: (torch.sub, torch.subtract, T.sub, T.__sub__), torch.sub, reflected=lambda: (T.__rsub__,)
)
binary(
    "mul", lambda: (torch.mul, torch.multiply, T.mul, T.__mul__), torch.mul, reflected=lambda: (T.__rmul__,)
)
binary(
    "div",
    lambda: (torch.div, torch.true_divide, T.div, T.__truediv__),
    torch.div,
    reflected=lambda: (T.__rtruediv__,),
    true_div=True,
)
binary("pow", lambda: (torch.pow, T.pow, T.__pow__), torch.pow, reflected=lambda: (T.__rpow__,))
binary("maximum", lambda: (torch.maximum, T.maximum), torch.maximum, tensors_only=True, scalar="max")
binary("minimum", lambda: (torch.minimum, T.minimum), torch.minimum, tensors_only=True, scalar="min")
binary("eq", lambda: (torch.eq, T.eq, T.__eq__), torch.eq, compare=True)
binary("ne", lambda: (torch.ne, T.ne, T.__ne__), torch.ne, compare=True)
binary("lt", lambda: (torch.lt, T.lt, T.__lt__), torch.lt, compare=True)
binary("le", lambda: (torch.le, T.le, T.__le__), torch.le, compare=True)
binary("gt", lambda: (torch.gt, T.gt, T.__gt__), torch.gt, compare=True)
binary("ge", lambda: (torch.ge, T.ge, T.__ge__), torch.ge, compare=True)
binary(
    "logical_and",
    lambda: (torch.logical_and, T.logical_and),
    torch.logical_and,
    compare=True,
    tensors_only=True,
    scalar="and",
)
binary(
    "logical_or",
    lambda: (torch.logical_or, T.logical_or),
    torch.logical_or,
    compare=True,
    tensors_only=True,
    scalar="or",
)

# -- unary math -------------------------------------------------------------
unary("neg", lambda: (torch.neg, T.neg, T.__neg__), torch.neg)
unary("abs", lambda: (torch.abs, T.abs, T.__abs__), torch.abs)
unary("exp", lambda: (torch.exp, T.exp), torch.exp, floating=True)
unary("log", lambda: (torch.log, T.log), torch.log, floating=True)
unary("sqrt", lambda: (torch.sqrt, T.sqrt), torch.sqrt, floating=True)
unary("rsqrt", lambda: (torch.rsqrt, T.rsqrt), torch.rsqrt, floating=True)
unary("erf", lambda: (torch.erf, T.erf, torch.special.erf), torch.erf, floating=True)
unary("tanh", lambda: (torch.tanh, T.tanh, F.tanh), torch.tanh, floating=True)
unary("sigmoid", lambda: (torch.sigmoid, T.sigmoid, F.sigmoid), torch.sigmoid, floating=True)
unary("relu", lambda: (torch.relu, T.relu, F.relu), torch.relu, scalar=None)  # max(x, 0): a rule
unary("silu", lambda: (F.silu,), F.silu, floating=True, decompose=lambda b, x: x * x.sigmoid())
unary(
    "logical_not", lambda: (torch.logical_not, T.logical_not), torch.logical_not, to_bool=True, scalar="not"
)
binary(
    "floor_divide",
    lambda: (torch.floor_divide, T.floor_divide, T.__floordiv__),
    torch.floor_divide,
    reflected=lambda: (T.__rfloordiv__,),
    scalar="floordiv",
)
binary(
    "remainder",
    lambda: (torch.remainder, T.remainder, T.__mod__),
    torch.remainder,
    reflected=lambda: (T.__rmod__,),
    scalar="mod",
)
binary("fmod", lambda: (torch.fmod, T.fmod), torch.fmod)
binary("atan2", lambda: (torch.atan2, torch.arctan2, T.atan2, T.arctan2), torch.atan2, true_div=True)
binary(
    "bitwise_and",
    lambda: (torch.bitwise_and, T.bitwise_and, T.__and__),
    torch.bitwise_and,
    reflected=lambda: (T.__rand__,),
    scalar="bitand",
)
binary(
    "bitwise_or",
    lambda: (torch.bitwise_or, T.bitwise_or, T.__or__),
    torch.bitwise_or,
    reflected=lambda: (T.__ror__,),
    scalar="bitor",
)
binary(
    "bitwise_xor",
    lambda: (torch.bitwise_xor, T.bitwise_xor, T.__xor__),
    torch.bitwise_xor,
    reflected=lambda: (T.__rxor__,),
    scalar="bitxor",
)
binary(
    "logical_xor",
    lambda: (torch.logical_xor, T.logical_xor),
    torch.logical_xor,
    compare=True,
    tensors_only=True,
    scalar="xor",
)

unary("sin", lambda: (torch.sin, T.sin), torch.sin, floating=True)
unary("cos", lambda: (torch.cos, T.cos), torch.cos, floating=True)
unary("tan", lambda: (torch.tan, T.tan), torch.tan, floating=True)
unary("atan", lambda: (torch.atan, torch.arctan, T.atan, T.arctan), torch.atan, floating=True)
unary("asinh", lambda: (torch.asinh, torch.arcsinh, T.asinh, T.arcsinh), torch.asinh, floating=True)
unary("atanh", lambda: (torch.atanh, torch.arctanh, T.atanh, T.arctanh), torch.atanh, floating=True)
unary("log1p", lambda: (torch.log1p, T.log1p, torch.special.log1p), torch.log1p, floating=True)
unary("log2", lambda: (torch.log2, T.log2), torch.log2, floating=True)
unary("expm1", lambda: (torch.expm1, T.expm1, torch.special.expm1), torch.expm1, floating=True)
unary("reciprocal", lambda: (torch.reciprocal, T.reciprocal), torch.reciprocal, floating=True)
# rounding keeps integer dtypes (an exact copy), unlike the float-valued math above
unary("floor", lambda: (torch.floor, T.floor), torch.floor)
unary("ceil", lambda: (torch.ceil, T.ceil), torch.ceil)
unary("trunc", lambda: (torch.trunc, torch.fix, T.trunc, T.fix), torch.trunc)
unary("sign", lambda: (torch.sign, T.sign), torch.sign)
unary(
    "bitwise_not",
    lambda: (torch.bitwise_not, T.bitwise_not, T.__invert__),
    torch.bitwise_not,
    scalar="bitnot",
)


# -- composite activations: each one's math, once ---------------------------------------------
def _hardsigmoid(b: Builder, x: Sym) -> Sym:
    return (x / 6.0 + 0.5).clamp(0.0, 1.0)


def _mish(b: Builder, x: Sym) -> Sym:
    return x * b.op("softplus", x, beta=1.0, threshold=20.0).tanh()


def _logsigmoid(b: Builder, x: Sym) -> Sym:
    # min(x, 0) - log1p(exp(-|x|)): no overflow of exp for either sign of x
    return x.clamp(max=0.0) - (-x.abs()).exp().log1p()


unary("hardsigmoid", lambda: (F.hardsigmoid,), F.hardsigmoid, decompose=_hardsigmoid)
unary("hardswish", lambda: (F.hardswish,), F.hardswish, decompose=lambda b, x: x * _hardsigmoid(b, x))
unary("mish", lambda: (F.mish,), F.mish, decompose=_mish)
unary("logsigmoid", lambda: (F.logsigmoid,), F.logsigmoid, decompose=_logsigmoid)
# selu: the constants are torch's (Klambauer et al., "Self-Normalizing Neural Networks")
unary(
    "selu",
    lambda: (F.selu, torch.selu),
    torch.selu,
    floating=True,
    decompose=lambda b, x: (
        1.0507009873554804934193349852946 * where(x > 0, x, 1.6732632423543772848170429916717 * x.expm1())
    ),
)


class Square(Op):
    """``x * x``; bool squares to int64 (torch computes it as ``pow(x, 2)``)."""

    name = "square"
    traits = _ELEMENTWISE

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.square, T.square)

    @staticmethod
    def capture(b: Emitter, input: Any, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        return b.emit("square", [input])

    @staticmethod
    def infer(ctx: ShapeContext, x: Type) -> Type:
        t = tensor_of(x)
        return t.replace(dtype=DType.i64) if t.dtype == DType.bool else t

    @staticmethod
    def reference(x: Any) -> Any:
        return torch.square(x)


class Round(Op):
    name = "round"
    traits = _ELEMENTWISE
    scalar = "round"  # with decimals=0 only: the rule refuses the others

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.round, T.round)

    @staticmethod
    def capture(b: Emitter, input: Any, *, decimals: Any = 0, out: Any = None) -> Any:
        if out is not None or not isinstance(decimals, int):
            raise NotCaptured("only round(x) and round(x, decimals=<int>) are captured")
        return b.emit("round", [input], decimals=decimals)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, decimals: int) -> Type:
        t = tensor_of(x)
        if decimals and not t.dtype.is_floating:
            raise ShapeError("round with decimals takes float tensors")
        return t

    @staticmethod
    def reference(x: Any, *, decimals: int) -> Any:
        # the decimals overload has no integer kernels
        return torch.round(x, decimals=decimals) if decimals else torch.round(x)


class Cast(Op):
    """Elementwise conversion to ``dtype`` (``x.to(dtype)``, ``x.float()`` ...).

    Conversions that change nothing are not recorded: torch returns the tensor
    itself for them, so the capture returns its input.
    """

    name = "cast"
    traits = _ELEMENTWISE

    @staticmethod
    def torch() -> tuple[Any, ...]:
        methods = {
            T.float: torch.float32,
            T.double: torch.float64,
            T.half: torch.float16,
            T.bfloat16: torch.bfloat16,
            T.long: torch.int64,
            T.int: torch.int32,
            T.short: torch.int16,
            T.char: torch.int8,
            T.byte: torch.uint8,
            T.bool: torch.bool,
        }
        return (
            (T.to, _to_capture),
            (T.type_as, _type_as_capture),
            (T.type, _type_capture),
            (T.cpu, _cpu_capture),
            *((m, _method_capture(d)) for m, d in methods.items()),
        )

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, dtype: DType) -> Type:
        return tensor_of(x).replace(dtype=dtype)

    @staticmethod
    def reference(x: Any, *, dtype: DType) -> Any:
        return x.to(dtype.torch)


class Clone(Op):
    """A new tensor with ``x``'s values, for a returned value eager gives as a new tensor
    where the graph's structure alone would make it an alias (``return x.clone()``).

    Not captured from torch calls (a copy of an immutable value is the value): the
    capture emits it only for outputs; see [Note: output aliasing] in
    :mod:`cuvil_ir.graph_ir.aliases`.
    """

    name = "clone"
    #: "frontend": emitted by the frontend, not captured from a torch call, so its tests
    #: are where it is emitted (cuvil-core's test_output_aliasing.py)
    traits = frozenset({"pure", "frontend"})

    @staticmethod
    def infer(ctx: ShapeContext, x: Type) -> Type:
        return tensor_of(x)

    @staticmethod
    def reference(x: Any) -> Any:
        return x.clone(memory_format=torch.contiguous_format)

    @staticmethod
    def decompose(b: Builder, x: Sym) -> Sym:
        # the value itself: a target copies every output that is not its own fresh buffer
        return x


def _cast(b: Emitter, x: Any, dtype: DType | None, device: str | None = None, copy: bool = False) -> Any:
    t = tensor_of(b.type_of(x))
    if device is not None and device != t.device:
        # moving data between devices is the runtime's business; "cuda" without an
        # index may or may not be the tensor's device, so it is not decided here
        raise NotCaptured(f"a transfer from {t.device} to {device} is not captured")
    if (dtype is None or dtype == t.dtype) and not copy:
        return x
    return b.emit("cast", [x], dtype=dtype or t.dtype)


def _method_capture(dtype: Any) -> Any:
    def capture(b: Emitter, self: Any, memory_format: Any = None) -> Any:
        # memory formats only choose strides; Graph IR values have none
        return _cast(b, self, DType.from_torch(dtype))

    return capture


def _to_capture(b: Emitter, self: Any, *args: Any, **kwargs: Any) -> Any:
    dtype: Any = kwargs.pop("dtype", None)
    device: Any = kwargs.pop("device", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise NotCaptured(f"Tensor.to does not take {sorted(kwargs)}")
    bools = []
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, bool):
            bools.append(a)  # non_blocking, then copy
        elif isinstance(a, (str, torch.device, int)):
            device = a
        elif b.is_value(a):
            other = tensor_of(b.type_of(a))
            dtype, device = other.dtype, other.device
        else:
            raise NotCaptured(f"Tensor.to({a!r})")
    if len(bools) > 1:
        copy = copy or bools[1]
    return _cast(b, self, dtype_arg(dtype), device_arg(device), copy)


def _type_as_capture(b: Emitter, self: Any, other: Any) -> Any:
    o = tensor_of(b.type_of(other))
    return _cast(b, self, o.dtype, o.device)


def _type_capture(b: Emitter, self: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    if not isinstance(dtype, torch.dtype):
        raise NotCaptured("Tensor.type() with a type name or without a dtype")
    return _cast(b, self, dtype_arg(dtype))


def _cpu_capture(b: Emitter, self: Any, memory_format: Any = None) -> Any:
    return _cast(b, self, None, "cpu")


class Triangle(Op):
    """Shared rule of ``tril``/``triu``: zero the elements outside a band of the last two dims.

    Not ``elementwise``: whether an element is kept depends on its position.
    """

    traits = frozenset({"pure"})

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, diagonal: Any) -> Type:
        t = tensor_of(x)
        if t.rank < 2:
            raise ShapeError(f"tril/triu need at least 2 dimensions, got {t.rank}")
        return t


def _triangle(name: str, fn: Any, method: Any) -> type[Op]:
    def capture(b: Emitter, input: Any, diagonal: Any = 0, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        return b.emit(name, [input], diagonal=size_arg(diagonal))

    def reference(x: Any, *, diagonal: int) -> Any:
        return fn(x, diagonal)

    return declare(name, torch=lambda: (fn, method), capture=capture, reference=reference, base=Triangle)


_triangle("tril", torch.tril, T.tril)
_triangle("triu", torch.triu, T.triu)
