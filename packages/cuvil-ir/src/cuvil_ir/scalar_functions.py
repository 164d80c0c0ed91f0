"""The scalar functions of Tensor IR, one row each: the table every renderer reads.

A kernel's body calls these functions (:class:`cuvil_ir.tensor_ir.expr.Call`). Each row
says what a renderer needs to know about one function without naming any renderer's
code: its arity, whether it is defined on float operands only, whether its cost
dominates a pointwise chain (the fusion policy counts those), whether the Triton device
library provides it (``cu.<name>``, one dtype in and out), whether libdevice has a
function of that name and meaning (the compiled device libraries bind it directly), and
an optional decomposition into other scalar functions.

What is derived from here (no second list anywhere): ``expr.FUNCTIONS`` and
``expr.TRANSCENDENTAL``, the Triton renderer's ``cu`` float calls
(:data:`DEVICE_FLOAT`), the device library's ``NAMES``, the names the ``cuda`` and
``ascend`` libraries bind from libdevice (:data:`LIBDEVICE`), and the fallback of a
consumer without a native form of a function (:func:`expand`).

[Note: scalar decompositions] A decomposition is a Python expression over the
arguments ``x``, ``y``, ``z`` (in that order), numbers, ``+ - * /``, unary ``-`` and calls
of other functions of this table: ``"0.5 * log1p(2 * x / (1 - x))"``. A consumer
without a native form of the function emits its decomposition with :func:`expand`,
giving its own ``call`` and ``const``: the C renderer, MLIR and ONNX export, and the
interpreted device library (which evaluates it in float64 and rounds once). A
decomposition should be as accurate as the consumers that use it need (its docstring
says how accurate it is); a function with a native form everywhere needs none.

This module imports nothing of Cuvil's, so every package (the runtime's device
library included) can read it without an import cycle.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar, Unpack

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ScalarFunction:
    """One scalar function (see the module docstring for what each field decides)."""

    name: str
    arity: int
    #: defined on float operands only (lowering converts integers first, or never emits it)
    float_only: bool = False
    #: its cost dominates a pointwise chain (the fusion policy counts it)
    transcendental: bool = False
    #: the Triton device library provides it as ``cu.<name>`` (float, one dtype in and out)
    device: bool = False
    #: libdevice has it under the same name and meaning: the compiled device libraries
    #: bind ``libdevice.<name>`` as ``cu.<name>`` (unless they write their own)
    libdevice: bool = False
    #: the function written in other functions of the table ([Note: scalar decompositions])
    decomposition: str | None = None


class _Flags(TypedDict, total=False):
    float_only: bool
    transcendental: bool
    device: bool
    libdevice: bool


def _rows(names: str, arity: int, **flags: Unpack[_Flags]) -> list[ScalarFunction]:
    return [ScalarFunction(n, arity, **flags) for n in names.split()]


_FLOAT: _Flags = {"float_only": True, "transcendental": True}
_CU: _Flags = {**_FLOAT, "device": True}
_LIB: _Flags = {**_CU, "libdevice": True}

#: every scalar function, in the order of ``expr.FUNCTIONS``
TABLE: dict[str, ScalarFunction] = {
    f.name: f
    for f in [
        *_rows("neg abs", 1),
        *_rows("exp expm1 log log1p log2", 1, **_LIB),
        *_rows("sqrt rsqrt", 1, **_FLOAT),
        *_rows("sin cos tan atan asinh tanh erf", 1, **_LIB),
        # a few ulps (log1p's); -0.0 kept, ±1 -> ±inf, NaN past ±1
        ScalarFunction("atanh", 1, **_LIB, decomposition="0.5 * log1p(2 * x / (1 - x))"),
        *_rows("sigmoid", 1, **_FLOAT),
        *_rows("floor ceil", 1, float_only=True),
        ScalarFunction("trunc", 1, float_only=True, device=True, libdevice=True),
        ScalarFunction("round", 1, float_only=True, device=True),  # libdevice's is nearbyint
        *_rows("sign not bitnot", 1),
        ScalarFunction("reciprocal", 1, float_only=True),
        *_rows("cast", 1),
        *_rows("add sub mul", 2),
        ScalarFunction("div", 2, transcendental=True),
        *_rows("floordiv mod", 2),
        ScalarFunction("fmod", 2, device=True, libdevice=True),  # the float form; integers: cu.fmod_int
        ScalarFunction("pow", 2, **_LIB),
        *_rows("max min", 2),
        ScalarFunction("atan2", 2, **_LIB),
        *_rows("and or xor bitand bitor bitxor eq ne lt le gt ge", 2),
        ScalarFunction("rand", 2, transcendental=True),
        ScalarFunction("where", 3),
    ]
}

#: the float functions Triton kernels call as ``cu.<name>``
DEVICE_FLOAT = frozenset(f.name for f in TABLE.values() if f.device)
#: the device functions libdevice has under the same name and meaning
LIBDEVICE = tuple(f.name for f in TABLE.values() if f.libdevice)

_ARGS = ("x", "y", "z")
_INFIX = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}


@functools.cache
def _parsed(fn: str) -> ast.expr:
    text = TABLE[fn].decomposition
    if text is None:
        raise KeyError(f"scalar function {fn} has no decomposition")
    return ast.parse(text, mode="eval").body


def decomposed(fn: str) -> bool:
    """Whether ``fn`` has a decomposition."""
    return fn in TABLE and TABLE[fn].decomposition is not None


def expand(fn: str, args: Sequence[T], call: Callable[[str, list[T]], T], const: Callable[[float], T]) -> T:
    """``fn(*args)`` written as its decomposition: ``call(name, operands)`` for each
    function it calls (innermost first), ``const(value)`` for each number."""
    names = dict(zip(_ARGS, args))

    def visit(node: ast.expr) -> T:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return const(float(node.value))
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _INFIX:
            return call(_INFIX[type(node.op)], [visit(node.left), visit(node.right)])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return call("neg", [visit(node.operand)])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return call(node.func.id, [visit(a) for a in node.args])
        raise ValueError(f"decomposition of {fn}: {ast.unparse(node)} is not a scalar expression")

    return visit(_parsed(fn))


def calls(fn: str) -> list[tuple[str, int]]:
    """The (function, operand count) pairs ``fn``'s decomposition calls, in order."""
    out: list[tuple[str, int]] = []

    def call(name: str, operands: list[None]) -> None:
        out.append((name, len(operands)))

    expand(fn, [None] * TABLE[fn].arity, call, lambda v: None)
    return out


__all__ = ["DEVICE_FLOAT", "LIBDEVICE", "TABLE", "ScalarFunction", "calls", "decomposed", "expand"]
