"""Tensors made from sizes alone: ``arange`` and ``full`` (zeros, ones, *_like, new_*).

Factories have no tensor inputs; their sizes are attributes, possibly size
expressions over the graph's input sizes. dtype and device are always explicit
in the IR: torch's defaults are resolved at capture time.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.ops._rules import (
    ShapeError,
    device_arg,
    dtype_arg,
    floordiv,
    size_arg,
    size_args,
    tensor_of,
)
from cuvil_ir.graph_ir.registry import CaptureRule, Emitter, NotCaptured, Op
from cuvil_ir.graph_ir.types import DType, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext

T = torch.Tensor


def _default_dtype() -> DType:
    return DType.from_torch(torch.get_default_dtype())


def _default_device() -> str:
    get = getattr(torch, "get_default_device", None)
    return str(get()) if get is not None else "cpu"


#: the keyword-only tensor options every factory takes; requires_grad and pin_memory
#: do not change the values, so they are accepted and dropped
_OPTIONS = frozenset({"dtype", "device", "layout", "requires_grad", "pin_memory"})


def _options(options: dict[str, Any], *also: str) -> tuple[DType | None, str | None]:
    """dtype and device of a factory call, when given; ``also`` names the further keywords
    the torch function takes (``out``, ``memory_format``: strides are not values)."""
    unknown = set(options) - _OPTIONS - set(also)
    if unknown:
        raise NotCaptured(f"unusual arguments {sorted(unknown)}")
    if options.get("out") is not None or options.get("layout") not in (None, torch.strided):
        raise NotCaptured("out= or a non-strided layout")
    return dtype_arg(options.get("dtype")), device_arg(options.get("device"))


def _scalar(v: Any, what: str) -> Any:
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, sympy.Basic):
        return size_arg(v)
    raise NotCaptured(f"{what} must be a Python number or a size, got {type(v).__name__}")


class Arange(Op):
    name = "arange"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (torch.arange,)

    @staticmethod
    def capture(b: Emitter, *args: Any, **kwargs: Any) -> Any:
        bounds: dict[str, Any] = {k: kwargs.pop(k) for k in ("start", "end", "step") if k in kwargs}
        dt, dev = _options(kwargs, "out")
        if len(args) == 1 and not bounds:
            start, end, step = 0, args[0], 1
        else:
            named = dict(zip(("start", "end", "step"), args))
            if set(named) & set(bounds):
                raise NotCaptured("unusual arange arguments")
            named.update(bounds)
            if "end" not in named:
                raise NotCaptured("arange without end")
            start, end, step = named.get("start", 0), named["end"], named.get("step", 1)
        start, end, step = (_scalar(v, "an arange bound") for v in (start, end, step))
        if isinstance(step, sympy.Basic):
            raise NotCaptured("a symbolic arange step")
        floats = any(isinstance(v, float) for v in (start, end, step))
        if floats and any(isinstance(v, sympy.Basic) for v in (start, end, step)):
            raise NotCaptured("arange mixing float bounds and symbolic sizes")
        dt = dt or (_default_dtype() if floats else DType.i64)
        return b.emit(
            "arange", [], start=start, end=end, step=step, dtype=dt, device=dev or _default_device()
        )

    @staticmethod
    def infer(ctx: ShapeContext, *, start: Any, end: Any, step: Any, dtype: DType, device: str) -> Type:
        if isinstance(step, sympy.Basic) or step == 0:
            raise ShapeError("arange step must be a nonzero number")
        if any(isinstance(v, float) for v in (start, end, step)):
            if any(isinstance(v, sympy.Basic) for v in (start, end, step)):
                raise ShapeError("arange with float bounds and symbolic sizes")
            length: Dim = math.ceil((end - start) / step)
        else:
            # ceil((end - start) / step), for either sign of step
            length = floordiv(end - start + step - (1 if step > 0 else -1), step)
        ok = (
            length >= 0
            if isinstance(length, int)
            else ctx.decide(sympy.Ge(length, 0), "arange bounds agree with step")
        )
        if not ok:
            raise ShapeError(f"arange({start}, {end}, {step}): bounds inconsistent with the step sign")
        return TensorType(dtype, (length,), device)

    @staticmethod
    def reference(*, start: Any, end: Any, step: Any, dtype: DType, device: str) -> Any:
        return torch.arange(start, end, step, dtype=dtype.torch, device=device)


class Full(Op):
    """A tensor of ``shape`` filled with ``value``."""

    name = "full"
    traits = frozenset({"pure"})

    @staticmethod
    def torch() -> tuple[Any, ...]:
        return (
            torch.full,
            (torch.zeros, _filled(0)),
            (torch.ones, _filled(1)),
            # empty: any contents are correct, and zeros are deterministic
            (torch.empty, _filled(0)),
            (torch.zeros_like, _like(0)),
            (torch.ones_like, _like(1)),
            (torch.empty_like, _like(0)),
            (torch.full_like, _full_like),
            (T.new_zeros, _new(0)),
            (T.new_ones, _new(1)),
            (T.new_empty, _new(0)),
            (T.new_full, _new_full),
        )

    @staticmethod
    def capture(b: Emitter, size: Any, fill_value: Any, **options: Any) -> Any:
        dt, dev = _options(options, "out")
        value = _scalar(fill_value, "fill_value")
        if dt is None:  # inferred from the fill value, as torch.full does
            dt = (
                DType.bool
                if isinstance(value, bool)
                else (_default_dtype() if isinstance(value, float) else DType.i64)
            )
        return _emit(b, size_args((size,)), value, dt, dev or _default_device())

    @staticmethod
    def infer(ctx: ShapeContext, *, shape: tuple[Dim, ...], value: Any, dtype: DType, device: str) -> Type:
        if any(isinstance(d, int) and d < 0 for d in shape):
            raise ShapeError(f"negative size in {shape}")
        return TensorType(dtype, shape, device)

    @staticmethod
    def reference(*, shape: tuple[int, ...], value: Any, dtype: DType, device: str) -> Any:
        return torch.full(shape, value, dtype=dtype.torch, device=device)


def _emit(b: Emitter, size: tuple[Any, ...], value: Any, dtype: DType, device: str) -> Any:
    return b.emit("full", [], shape=tuple(size_arg(s) for s in size), value=value, dtype=dtype, device=device)


def _filled(value: int) -> CaptureRule:
    """``zeros``, ``ones``, ``empty``: sizes as varargs, one sequence, or ``size=``."""

    def capture(b: Emitter, *size: Any, **options: Any) -> Any:
        sizes = size_args((options.pop("size"),)) if "size" in options else size_args(size)
        dt, dev = _options(options, "out", "memory_format")
        return _emit(b, sizes, value, dt or _default_dtype(), dev or _default_device())

    return capture


def _emit_like(
    b: Emitter, like: Any, size: tuple[Any, ...] | None, value: Any, options: dict[str, Any], *also: str
) -> Any:
    """``full`` with the dtype and device of the tensor ``like`` unless the options give them,
    and of its shape when ``size`` is None (the ``*_like`` and ``new_*`` functions)."""
    t = tensor_of(b.type_of(like))
    dt, dev = _options(options, *also)
    return _emit(
        b, t.shape if size is None else size, _scalar(value, "fill_value"), dt or t.dtype, dev or t.device
    )


def _like(value: int) -> CaptureRule:
    def capture(b: Emitter, input: Any, **options: Any) -> Any:
        return _emit_like(b, input, None, value, options, "memory_format")

    return capture


def _full_like(b: Emitter, input: Any, fill_value: Any, **options: Any) -> Any:
    return _emit_like(b, input, None, fill_value, options, "memory_format")


def _new(value: int) -> CaptureRule:
    def capture(b: Emitter, self: Any, *size: Any, **options: Any) -> Any:
        return _emit_like(b, self, size_args(size), value, options)

    return capture


def _new_full(b: Emitter, self: Any, size: Any, fill_value: Any, **options: Any) -> Any:
    return _emit_like(b, self, size_args((size,)), fill_value, options)
