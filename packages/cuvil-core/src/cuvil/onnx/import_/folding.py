"""Constant folding at import time.

Shape computations (``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape``, as the
exporters write them) are folded while importing: a value whose contents are known
(constants, initializers used as shapes/axes, ``Shape`` of a tensor with symbolic dims)
is a :class:`Known`, a numpy array whose elements may be size expressions, and turns
into an attribute where an op needs one. The shape ops fold their known inputs in their
handlers (:mod:`.ops_shape`); the arithmetic and predicates written on sizes fold here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import sympy

from cuvil_ir.graph_ir.types import DType


class Known:
    """A value whose contents are known at import time (elements: ints, floats, sympy)."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: Any, dtype: DType) -> None:
        self.array = np.asarray(array, dtype=object) if not isinstance(array, np.ndarray) else array
        self.dtype = dtype

    def ints(self) -> list[Any]:
        return [to_dim(v) for v in self.array.reshape(-1).tolist()]


def to_dim(v: Any) -> Any:
    """A known element as a dim: an ``int`` when integral, else as it is (sympy, float)."""
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, sympy.Basic):
        v = sympy.sympify(v)
        return int(v) if v.is_Integer else v
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    return v


def known_scalar(k: Known | None) -> Any:
    """The single element of a known one-element value (an int, bool, float or size
    expression), or ``None``."""
    if k is None or k.array.size != 1:
        return None
    v = k.array.reshape(-1)[0]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return to_dim(v)


_NUMPY_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Equal": lambda a, b: np.vectorize(lambda x, y: bool(sympy.Eq(x, y)) if _decidable(x, y) else None)(a, b),
}


def _exact_div(x: Any, y: Any) -> Any:
    """``x / y`` of known values, exact (rational) when both are integral."""
    x, y = to_dim(x), to_dim(y)
    if isinstance(x, sympy.Basic) or isinstance(y, sympy.Basic):
        return sympy.sympify(x) / sympy.sympify(y)
    return x / y


def _decidable(x: Any, y: Any) -> bool:
    try:
        bool(sympy.Eq(x, y))
        return True
    except TypeError:
        return False


_RELATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "Less": sympy.Lt,
    "LessOrEqual": sympy.Le,
    "Greater": sympy.Gt,
    "GreaterOrEqual": sympy.Ge,
    "And": sympy.And,
    "Or": sympy.Or,
}


def fold_binary(op_type: str, ka: Known, kb: Known) -> Known | None:
    """``op_type`` (an ONNX binary op) of two known values, or ``None`` when it does not fold."""
    if op_type in ("Add", "Sub", "Mul", "Div", "Equal"):
        if op_type == "Div":
            if ka.dtype.is_integer:
                res = np.vectorize(
                    lambda x, y: (
                        sympy.floor(sympy.sympify(x) / y) if isinstance(x, sympy.Basic) else int(x) // int(y)
                    ),
                    otypes=[object],
                )(ka.array, kb.array)
            else:
                res = np.vectorize(_exact_div, otypes=[object])(ka.array, kb.array)
        else:
            res = _NUMPY_BINARY[op_type](ka.array, kb.array)
        if not (op_type == "Equal" and any(x is None for x in np.asarray(res).reshape(-1))):
            return Known(np.asarray(res, dtype=object), DType.bool if op_type == "Equal" else ka.dtype)
    if op_type in _RELATIONS and ka.array.size == kb.array.size == 1:
        # a size predicate (one element; e.g. the condition of an If on sizes)
        x, y = to_dim(ka.array.reshape(-1)[0]), to_dim(kb.array.reshape(-1)[0])
        rel = _RELATIONS[op_type](sympy.sympify(x), sympy.sympify(y))
        val = bool(rel) if isinstance(rel, sympy.logic.boolalg.BooleanAtom) else rel
        shape = np.broadcast_shapes(ka.array.shape, kb.array.shape)
        return Known(np.full(shape, val, dtype=object), DType.bool)
    return None


def fold_variadic(op_type: str, ks: Sequence[Known | None]) -> Known | None:
    """``Max``/``Min`` of one-element known values, or ``None``."""
    if op_type in ("Max", "Min") and all(k is not None and k.array.size == 1 for k in ks):
        vals_k = [to_dim(k.array.reshape(-1)[0]) for k in ks if k is not None]
        fn = sympy.Max if op_type == "Max" else sympy.Min
        return Known(np.array(to_dim(fn(*vals_k)), dtype=object), ks[0].dtype)  # type: ignore[union-attr]
    return None


def fold_unary(op_type: str, k: Known) -> Known | None:
    """``Neg``, ``Not`` or ``Ceil``/``Floor`` of a known value, or ``None``."""
    if op_type == "Neg":
        return Known(-k.array, k.dtype)
    if op_type == "Not" and k.array.size == 1:
        v = known_scalar(k)
        if isinstance(v, (bool, sympy.logic.boolalg.Boolean)):
            return Known(
                np.full(k.array.shape, sympy.Not(v) if isinstance(v, sympy.Basic) else not v, dtype=object),
                k.dtype,
            )
    if op_type in ("Ceil", "Floor") and k.array.size == 1:
        fn = sympy.ceiling if op_type == "Ceil" else sympy.floor
        # elementwise: the shape stays (a size expression is a [1] value)
        value = to_dim(fn(to_dim(k.array.reshape(-1)[0])))
        return Known(np.full(k.array.shape, value, dtype=object), k.dtype)
    return None


__all__ = ["Known", "fold_binary", "fold_unary", "fold_variadic", "known_scalar", "to_dim"]
