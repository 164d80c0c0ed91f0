"""Elementwise ops with parameters (clamp bounds, activation constants) and dropout.

The activations are composite: each declares its math once, as a decomposition into
primitive ops (:mod:`cuvil_ir.graph_ir.decompose`), which every backend lowers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_ir.graph_ir.decompose import Builder, Sym, where
from cuvil_ir.graph_ir.ops._rules import float_tensor, result_dtype, tensor_of
from cuvil_ir.graph_ir.registry import Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext

T = torch.Tensor


def _number(v: Any, what: str) -> Any:
    """A bound or constant given as a Python number (traced scalars are handled by callers)."""
    if v is None or (isinstance(v, (int, float)) and not isinstance(v, complex)):
        return v
    raise NotCaptured(f"{what} must be a Python number, got {type(v).__name__}")


def _done(b: Emitter, input: Any, result: Any, inplace: bool) -> Any:
    return b.rebind(input, result) if inplace else result


class Clamp(Op):
    """``clamp(x, min, max)`` with Python-number bounds; either bound may be absent.

    Tensor bounds broadcast and promote like ``maximum``/``minimum`` and propagate
    NaN the same way, so the capture writes them as those ops.
    """

    name = "clamp"
    traits = frozenset({"elementwise", "pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.clamp,
            torch.clip,
            T.clamp,
            T.clip,
            (torch.clamp_min, _clamp_min),
            (T.clamp_min, _clamp_min),
            (torch.clamp_max, _clamp_max),
            (T.clamp_max, _clamp_max),
            (F.hardtanh, _hardtanh),
            (F.relu6, _relu6),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, min: Any = None, max: Any = None, *, out: Any = None) -> Any:
        if out is not None:
            raise NotCaptured("out=")
        if min is None and max is None:
            raise NotCaptured("clamp without bounds is an error in torch")
        if not (b.is_value(min) or b.is_value(max)):
            return b.emit("clamp", [input], min=_number(min, "min"), max=_number(max, "max"))
        if (min is not None and not b.is_value(min)) or (max is not None and not b.is_value(max)):
            raise NotCaptured("clamp with one tensor and one number bound")  # torch rejects it
        r = input if min is None else b.emit("maximum", [input, min])
        return r if max is None else b.emit("minimum", [r, max])

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, min: int | float | None, max: int | float | None) -> Type:
        t = tensor_of(x)
        bounds = [ScalarType(ScalarKind.of(v)) for v in (min, max) if v is not None]
        return t.replace(dtype=result_dtype(t, *bounds))

    @staticmethod
    def reference(x: Any, *, min: Any, max: Any) -> Any:
        return torch.clamp(x, min, max)


def _clamp_min(b: Emitter, input: Any, min: Any) -> Any:
    return Clamp.capture(b, input, min=min)


def _clamp_max(b: Emitter, input: Any, max: Any) -> Any:
    return Clamp.capture(b, input, max=max)


def _hardtanh(b: Emitter, input: Any, min_val: Any = -1.0, max_val: Any = 1.0, inplace: bool = False) -> Any:
    if not tensor_of(b.type_of(input)).dtype.is_floating:
        raise NotCaptured("hardtanh of a non-float tensor")  # torch rejects it; extern reports that
    r = b.emit("clamp", [input], min=_number(min_val, "min_val"), max=_number(max_val, "max_val"))
    return _done(b, input, r, inplace)


def _relu6(b: Emitter, input: Any, inplace: bool = False) -> Any:
    return _hardtanh(b, input, 0.0, 6.0, inplace)


class _FloatActivation(Op):
    """An activation of float tensors; its parameters are attributes."""

    traits = frozenset({"elementwise", "pure"})


class Gelu(_FloatActivation):
    name = "gelu"

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.gelu,)

    @staticmethod
    def capture(b: Emitter, input: Any, approximate: str = "none") -> Any:
        if approximate not in ("none", "tanh"):
            raise NotCaptured(f"gelu approximate={approximate!r}")
        return b.emit("gelu", [input], approximate=approximate)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, approximate: str) -> Type:
        return float_tensor(x, "activation")

    @staticmethod
    def reference(x: Any, *, approximate: str) -> Any:
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def decompose(b: Builder, x: Sym, *, approximate: str) -> Sym:
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))
            return 0.5 * x * (1.0 + inner.tanh())
        return 0.5 * x * (1.0 + (x * math.sqrt(0.5)).erf())


class LeakyRelu(_FloatActivation):
    name = "leaky_relu"

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.leaky_relu,)

    @staticmethod
    def capture(b: Emitter, input: Any, negative_slope: Any = 0.01, inplace: bool = False) -> Any:
        r = b.emit("leaky_relu", [input], negative_slope=float(_number(negative_slope, "negative_slope")))
        return _done(b, input, r, inplace)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, negative_slope: float) -> Type:
        return float_tensor(x, "activation")

    @staticmethod
    def reference(x: Any, *, negative_slope: float) -> Any:
        return F.leaky_relu(x, negative_slope)

    @staticmethod
    def decompose(b: Builder, x: Sym, *, negative_slope: float) -> Sym:
        return where(x > 0, x, x * negative_slope)


class Elu(_FloatActivation):
    name = "elu"

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.elu,)

    @staticmethod
    def capture(b: Emitter, input: Any, alpha: Any = 1.0, inplace: bool = False) -> Any:
        r = b.emit("elu", [input], alpha=float(_number(alpha, "alpha")))
        return _done(b, input, r, inplace)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, alpha: float) -> Type:
        return float_tensor(x, "activation")

    @staticmethod
    def reference(x: Any, *, alpha: float) -> Any:
        return F.elu(x, alpha)

    @staticmethod
    def decompose(b: Builder, x: Sym, *, alpha: float) -> Sym:
        return where(x > 0, x, alpha * x.expm1())


class Softplus(_FloatActivation):
    name = "softplus"

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (F.softplus,)

    @staticmethod
    def capture(b: Emitter, input: Any, beta: Any = 1.0, threshold: Any = 20.0) -> Any:
        return b.emit(
            "softplus",
            [input],
            beta=float(_number(beta, "beta")),
            threshold=float(_number(threshold, "threshold")),
        )

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, beta: float, threshold: float) -> Type:
        return float_tensor(x, "activation")

    @staticmethod
    def reference(x: Any, *, beta: float, threshold: float) -> Any:
        return F.softplus(x, beta, threshold)

    @staticmethod
    def decompose(b: Builder, x: Sym, *, beta: float, threshold: float) -> Sym:
        # torch: x where beta * x > threshold (exp would overflow), else log1p(exp(beta * x)) / beta
        bx = x * beta if beta != 1 else x
        soft = bx.exp().log1p()
        return where(bx > threshold, x, soft / beta if beta != 1 else soft)


class Logit(_FloatActivation):
    """``log(x / (1 - x))``, ``x`` first clamped to ``[eps, 1 - eps]`` when ``eps`` is given
    (ATen's order: the clamp passes NaN through)."""

    name = "logit"

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.logit, T.logit, torch.special.logit)

    @staticmethod
    def capture(b: Emitter, input: Any, eps: Any = None) -> Any:
        t = b.type_of(input) if b.is_value(input) else None
        if not isinstance(t, TensorType) or not t.dtype.is_floating:
            raise NotCaptured("logit of an integer tensor or a number runs as torch's call")
        e = _number(eps, "eps")
        return b.emit("logit", [input], eps=None if e is None else float(e))

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, eps: float | None) -> Type:
        return float_tensor(x, "logit")

    @staticmethod
    def reference(x: Any, *, eps: float | None) -> Any:
        return torch.logit(x, eps)

    @staticmethod
    def decompose(b: Builder, x: Sym, *, eps: float | None) -> Sym:
        if eps is not None:
            x = x.clamp(eps, 1.0 - eps)
        return (x / (1.0 - x)).log()


class Dropout(Op):
    """Train-mode dropout: zeroes each element with probability ``p``, scales the rest.

    In eval mode every dropout variant is the identity, so nothing is recorded;
    only ``F.dropout`` in train mode becomes this op.
    """

    name = "dropout"
    traits = frozenset({"random"})
    extern_reasons = {
        "mlir": "dropout draws random numbers; the oracle has no torch generator",
        "onnx": "train-mode dropout draws random numbers (inference graphs have none)",
    }

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            F.dropout,
            (torch.dropout, _torch_dropout),
            *(
                (f, _feature_dropout)
                for f in (F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)
            ),
        )

    @staticmethod
    def capture(b: Emitter, input: Any, p: Any = 0.5, training: bool = True, inplace: bool = False) -> Any:
        p = _number(p, "p")
        if not 0.0 <= p <= 1.0:
            raise NotCaptured("dropout probability out of [0, 1]")  # torch raises; extern reports it
        if not training or p == 0:
            return input
        return _done(b, input, b.emit("dropout", [input], p=float(p)), inplace)

    @staticmethod
    def infer(ctx: ShapeContext, x: Type, *, p: float) -> Type:
        return float_tensor(x, "dropout")

    @staticmethod
    def reference(x: Any, *, p: float) -> Any:
        return F.dropout(x, p, True)


def _torch_dropout(b: Emitter, input: Any, p: Any, train: bool) -> Any:
    return Dropout.capture(b, input, p, train)


def _feature_dropout(
    b: Emitter, input: Any, p: Any = 0.5, training: bool = True, inplace: bool = False
) -> Any:
    # the default of `training` differs between these functions; True is the safe guess
    if training:
        raise NotCaptured("train-mode channel/alpha dropout")
    return input
