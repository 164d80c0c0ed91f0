"""Elementwise ops: broadcasting, torch type promotion, one declaration each.

Families share their rules through :func:`unary` and :func:`binary`, which
declare an :class:`Op` subclass (as JAX's ``standard_unop`` does); ops that do
not fit a family are written out as classes below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.ops._rules import broadcast_shapes, device_of, float_dtype, result_dtype, tensor_of
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, ScalarType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

T = torch.Tensor


def _elementwise_type(ctx: ShapeContext, inputs: tuple[Type, ...], dtype: DType) -> TensorType:
    shapes = [t.shape for t in inputs if isinstance(t, TensorType)]
    return TensorType(dtype, broadcast_shapes(ctx, *shapes), device_of(*inputs))


def unary(
    name: str,
    fns: Callable[[], tuple[Any, ...]],
    ref: Callable[[Any], Any],
    *,
    floating: bool = False,
    to_bool: bool = False,
) -> type[Op]:
    """Declare ``name(x)``; ``floating`` ops turn integer inputs into f32."""

    def infer(ctx: ShapeContext, x: Type) -> Type:
        t = tensor_of(x)
        dtype = DType.bool if to_bool else (float_dtype(t.dtype) if floating else t.dtype)
        return t.replace(dtype=dtype)

    def capture(b: Emitter, input: Any, inplace: bool = False, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out= is not captured")
        result = b.emit(name, [input])
        return b.rebind(input, result) if inplace else result

    def reference(x: Any) -> Any:
        return ref(x)

    ns = {
        "name": name,
        "traits": frozenset({"elementwise", "pure"}),
        "torch": staticmethod(fns),
        "capture": staticmethod(capture),
        "infer": staticmethod(infer),
        "reference": staticmethod(reference),
    }
    return type(name.title().replace("_", ""), (Op,), ns)


def binary(
    name: str,
    fns: Callable[[], tuple[Any, ...]],
    ref: Callable[[Any, Any], Any],
    *,
    reflected: Callable[[], tuple[Any, ...]] = tuple,
    compare: bool = False,
    true_div: bool = False,
) -> type[Op]:
    """Declare ``name(a, b)`` with broadcasting; ``reflected`` callables swap operands."""

    def infer(ctx: ShapeContext, a: Type, b: Type) -> Type:
        if isinstance(a, ScalarType) and isinstance(b, ScalarType):
            raise ValueError(f"{name}: at least one operand must be a tensor")
        dtype = result_dtype(a, b)
        if compare:
            dtype = DType.bool
        elif true_div:
            dtype = float_dtype(dtype)
        return _elementwise_type(ctx, (a, b), dtype)

    def capture(b: Emitter, input: Any, other: Any, *, alpha: Any = 1, out: Any = None) -> Any:
        if out is not None or alpha != 1:
            raise NotCaptured("only the plain form is captured")
        return b.emit(name, [input, other])

    def capture_reflected(b: Emitter, input: Any, other: Any) -> Any:
        return b.emit(name, [other, input])

    def reference(a: Any, b: Any) -> Any:
        return ref(a, b)

    ns = {
        "name": name,
        "traits": frozenset({"elementwise", "pure"}),
        "torch": staticmethod(lambda: (*fns(), *((f, capture_reflected) for f in reflected()))),
        "infer": staticmethod(infer),
        "reference": staticmethod(reference),
        "capture": staticmethod(capture),
    }
    return type(name.title().replace("_", ""), (Op,), ns)


def _where_capture(b: Emitter, condition: Any, input: Any, other: Any, *, out: Any = None) -> Any:
    if out is not None:
        raise NotCaptured("out=")
    return b.emit("where", [condition, input, other])


class Where(Op):
    name = "where"
    traits = frozenset({"elementwise", "pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.where, T.where)

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
binary("sub", lambda: (torch.sub, torch.subtract, T.sub, T.__sub__), torch.sub, reflected=lambda: (T.__rsub__,))
binary("mul", lambda: (torch.mul, torch.multiply, T.mul, T.__mul__), torch.mul, reflected=lambda: (T.__rmul__,))
binary(
    "div",
    lambda: (torch.div, torch.true_divide, T.div, T.__truediv__),
    torch.div,
    reflected=lambda: (T.__rtruediv__,),
    true_div=True,
)
binary("pow", lambda: (torch.pow, T.pow, T.__pow__), torch.pow, reflected=lambda: (T.__rpow__,))
binary("maximum", lambda: (torch.maximum, T.maximum), torch.maximum)
binary("minimum", lambda: (torch.minimum, T.minimum), torch.minimum)
binary("eq", lambda: (torch.eq, T.eq, T.__eq__), torch.eq, compare=True)
binary("ne", lambda: (torch.ne, T.ne, T.__ne__), torch.ne, compare=True)
binary("lt", lambda: (torch.lt, T.lt, T.__lt__), torch.lt, compare=True)
binary("le", lambda: (torch.le, T.le, T.__le__), torch.le, compare=True)
binary("gt", lambda: (torch.gt, T.gt, T.__gt__), torch.gt, compare=True)
binary("ge", lambda: (torch.ge, T.ge, T.__ge__), torch.ge, compare=True)
binary("logical_and", lambda: (torch.logical_and, T.logical_and), torch.logical_and, compare=True)
binary("logical_or", lambda: (torch.logical_or, T.logical_or), torch.logical_or, compare=True)

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
unary("relu", lambda: (torch.relu, T.relu, F.relu), torch.relu)
unary("silu", lambda: (F.silu,), F.silu, floating=True)
unary("logical_not", lambda: (torch.logical_not, T.logical_not), torch.logical_not, to_bool=True)
