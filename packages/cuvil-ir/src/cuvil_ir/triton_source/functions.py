"""Scalar functions of Tensor IR as Triton source text.

:func:`call` turns ``fn(*args)`` (``fn`` one of :data:`cuvil_ir.tensor_ir.expr.FUNCTIONS`)
into a Triton expression, :func:`const` a typed constant. The semantics are the C
generator's (``cuvil_backend_cpu.codegen``), which follow torch's: float max/min
propagate NaN, bool add/sub/mul stay bool (or/xor/and), a cast to bool is ``!= 0``,
float -> int casts truncate, ``round`` is half to even, float ``mod`` takes the
divisor's sign, integer ``floordiv``/``mod`` floor (``fmod`` truncates) and never trap
(a zero divisor gives 0: the caller records the error), ``rand`` is the CPU target's
Philox4x32-10 bit for bit. Float32 division and square root are the IEEE ones
(``tl.div_rn``, ``tl.sqrt_rn``; Triton's ``/`` and ``tl.sqrt`` are approximate there).

Contract with the generated module: the text names only two globals,

* ``tl`` -- ``triton.language``;
* ``cu`` -- the device library the target binds (:mod:`cuvil_runtime.triton_kernels.devicelib`):
  the functions ``tl`` lacks under ``TRITON_INTERPRET=1`` (libdevice does not run
  there) and the helpers: the float functions the table marks ``device``
  (:data:`cuvil_ir.scalar_functions.DEVICE_FLOAT`: ``cu.exp``, ``cu.atan2`` ...),
  ``cu.remainder`` (floats) and ``cu.floordiv mod fmod_int truncdiv
  iabs sign fmax fmin rand`` (``floordiv`` and ``mod`` also serve index arithmetic on
  int32/int64); the library also has ``cu.prod_combine`` for ``tl.reduce``.

An argument's text appears exactly once in the result (helpers bind a value used
twice), so nested calls grow linearly. Arguments are block tensors or 0-d values of
the dtype given for them; a constant from :func:`const` is a 0-d tensor of its own
dtype, so it broadcasts against blocks and combines with same-typed operands without
promotion. This module emits text only: it does not import triton.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cuvil_ir.graph_ir.decompose import LOW_PRECISION
from cuvil_ir.graph_ir.types import DType, stored_float
from cuvil_ir.scalar_functions import DEVICE_FLOAT
from cuvil_ir.tensor_ir.expr import FUNCTIONS


class TritonSourceError(NotImplementedError):
    """A function/dtype combination the generator has no Triton form for (as the C
    generator's CodegenError: lowering should not produce it)."""


#: [Note: half precision in Triton] A float16 or bfloat16 element is its own type in
#: memory (``*fp16`` / ``*bf16`` pointers: loads and stores move 2 bytes) and a float32 in
#: registers, as the C generator's ``float`` (``cuvil_backend_cpu.half``): a load widens
#: (exact), a cast to the type rounds to nearest even and widens again (``cu.round_f16`` /
#: ``cu.round_bf16``), a store narrows a value that is already rounded (exact). Lowering
#: has made every half op compute in float32 and cast its result back ([Note: opmath] in
#: :mod:`cuvil_ir.tensor_ir.rules.helpers`), so a fused chain rounds where eager rounds and
#: no arithmetic happens in a half type. A value of another type becomes a half one through
#: float32, as ``c10::Half``/``BFloat16`` are built. Bfloat16 goes through the device
#: library (``cu.round_bf16``, ``cu.widen_bf16``, ``cu.to_bf16``), never ``.to(tl.bfloat16)``
#: alone: Triton's interpreter (3.9's ``cast_impl``) truncates float32 to bfloat16 and
#: flushes bfloat16 subnormals to zero, where torch and compiled code round, so the
#: interpreter's forms use integers and the compiled ones convert (``cvt.rn.bf16.f32``).
HALF: frozenset[DType] = LOW_PRECISION

#: a half type's element type in memory (a load's and a store's; registers hold float32)
STORAGE_TYPES: dict[DType, str] = {DType.f16: "tl.float16", DType.bf16: "tl.bfloat16"}

#: the Triton type of a value of each dtype in registers (a half one is a float32:
#: [Note: half precision in Triton])
TL_DTYPES: dict[DType, str] = {
    DType.f16: "tl.float32",
    DType.bf16: "tl.float32",
    DType.f32: "tl.float32",
    DType.f64: "tl.float64",
    DType.i64: "tl.int64",
    DType.i32: "tl.int32",
    DType.i16: "tl.int16",
    DType.i8: "tl.int8",
    DType.u8: "tl.uint8",
    DType.bool: "tl.int1",
}

#: element types of a Triton kernel signature (a tensor of ``d`` is ``"*" + SIGNATURE_TYPES[d]``)
SIGNATURE_TYPES: dict[DType, str] = {
    DType.f16: "fp16",
    DType.bf16: "bf16",
    DType.f32: "fp32",
    DType.f64: "fp64",
    DType.i64: "i64",
    DType.i32: "i32",
    DType.i16: "i16",
    DType.i8: "i8",
    DType.u8: "u8",
    DType.bool: "i1",
}

_BITS = {DType.i64: 64, DType.i32: 32, DType.i16: 16, DType.i8: 8}

#: float functions the device library provides (``cu.<name>``), all of one dtype in and out
_CU_FLOAT = DEVICE_FLOAT
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^"}
#: bool arithmetic as the C form's ``(a op b) != 0`` on 0/1 values
_BOOL_ARITH = {"add": "|", "sub": "^", "mul": "&", "div": "&"}
_INT_DIVISION = {"floordiv": "floordiv", "mod": "mod", "fmod": "fmod_int", "div": "truncdiv"}


def const(value: bool | int | float, dtype: DType) -> str:
    """A 0-d ``dtype`` tensor holding ``value`` (exact: float64 values are not rounded
    through float32; integers wrap to ``dtype`` as a C cast does)."""
    tl_type = _tl(dtype)
    if dtype.is_floating:
        f = stored_float(float(value), dtype) if dtype in HALF else float(value)
        if math.isnan(f):
            text = 'float("nan")'
        elif math.isinf(f):
            text = 'float("inf")' if f > 0 else '-float("inf")'
        else:
            text = repr(f)
    elif dtype == DType.bool:
        text = "1" if value else "0"
    else:
        v = int(value)
        if dtype == DType.u8:
            v &= 0xFF
        else:
            bits = _BITS[dtype]
            v = (v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
        text = str(v)
    return f"tl.full([], {text}, {tl_type})"


def call(fn: str, args: Sequence[str], arg_dtypes: Sequence[DType], dtype: DType) -> str:
    """Triton expression text for ``fn(*args)`` with result ``dtype`` (for ``cast``, the
    target type); ``args[k]`` is an expression of dtype ``arg_dtypes[k]``."""
    if fn not in FUNCTIONS:
        raise TritonSourceError(f"unknown scalar function {fn!r}")
    if len(args) != FUNCTIONS[fn] or len(arg_dtypes) != len(args):
        raise TritonSourceError(f"{fn} takes {FUNCTIONS[fn]} arguments, got {len(args)}")
    _tl(dtype)
    for d in arg_dtypes:
        _tl(d)
    a = list(args)
    src = arg_dtypes[0]

    if fn != "cast" and dtype in HALF:
        return _half_call(fn, a, arg_dtypes, dtype)
    if fn == "cast":
        if dtype in HALF:
            return a[0] if src == dtype else round_to(a[0], src, dtype)
        if src in HALF and dtype == DType.f32:
            return a[0]  # a half value is a float32 in registers
        if dtype == DType.bool:
            return a[0] if src == DType.bool else _boolean(f"{_atom(a[0])} != 0")
        return a[0] if src == dtype else f"{_atom(a[0])}.to({_tl(dtype)})"
    if fn in _COMPARE:
        return _boolean(f"{_atom(a[0])} {_COMPARE[fn]} {_atom(a[1])}")
    if fn in ("and", "or", "xor"):
        op = {"and": "&", "or": "|", "xor": "^"}[fn]
        return f"({_truth(a[0], arg_dtypes[0])} {op} {_truth(a[1], arg_dtypes[1])})"
    if fn == "not":
        return _boolean(f"{_atom(a[0])} == 0")
    if fn == "where":
        return f"tl.where({_truth(a[0], arg_dtypes[0])}, {_as(a[1], arg_dtypes[1], dtype)}, {_as(a[2], arg_dtypes[2], dtype)})"
    if fn == "rand":
        return f"cu.rand({_as(a[0], arg_dtypes[0], DType.i64)}, {_as(a[1], arg_dtypes[1], DType.i64)})"

    # the rest compute in the result dtype, as C's conversions on assignment would
    x = [_as(t, d, dtype) for t, d in zip(a, arg_dtypes)]
    if dtype == DType.bool:
        return _bool_call(fn, x)
    if dtype.is_floating:
        return _float_call(fn, x, dtype)
    return _int_call(fn, x, dtype)


#: functions whose float result is one of their operands (or its negation): a half result
#: needs no rounding (as the C generator's ``_EXACT``)
_EXACT = frozenset({"where", "max", "min", "neg", "abs"})


def round_to(text: str, src: DType, dtype: DType) -> str:
    """``text`` (of dtype ``src``) rounded to the half ``dtype``, held as a float32
    ([Note: half precision in Triton]): through float32, as torch converts."""
    wide = text if src in HALF or src == DType.f32 else f"{_atom(text)}.to(tl.float32)"
    return f"cu.round_{dtype.value}({wide})"


def _half_call(fn: str, a: list[str], arg_dtypes: Sequence[DType], dtype: DType) -> str:
    """A half-typed ``fn``: computed in float32 and rounded once (lowering computes half
    math in float32 itself, [Note: opmath]; this keeps a rule that did not correct)."""
    wide = [DType.f32 if d in HALF else d for d in arg_dtypes]
    text = call(fn, a, wide, DType.f32)
    return text if fn in _EXACT else f"cu.round_{dtype.value}({text})"


def _bool_call(fn: str, x: list[str]) -> str:
    if fn in _BOOL_ARITH:
        return f"({_atom(x[0])} {_BOOL_ARITH[fn]} {_atom(x[1])})"
    if fn in _BITWISE:
        return f"({_atom(x[0])} {_BITWISE[fn]} {_atom(x[1])})"
    if fn in ("max", "min"):
        return f"({_atom(x[0])} {'|' if fn == 'max' else '&'} {_atom(x[1])})"
    if fn in ("neg", "abs", "sign"):
        return x[0]  # 0 and 1 are their own negation (mod 2), magnitude and sign
    if fn == "bitnot":
        return _boolean(f"{_atom(x[0])} == 0")  # torch's bitwise_not on bool is logical not
    raise TritonSourceError(f"{fn} on bool")


def _float_call(fn: str, x: list[str], dtype: DType) -> str:
    f32 = dtype == DType.f32
    one = const(1.0, dtype)
    if fn in ("add", "sub", "mul"):
        return f"({_atom(x[0])} {'+' if fn == 'add' else '-' if fn == 'sub' else '*'} {_atom(x[1])})"
    if fn == "div":
        return _div(x[0], x[1], f32)
    if fn == "neg":
        return f"(-{_atom(x[0])})"
    if fn == "abs":
        return f"tl.abs({x[0]})"
    if fn in ("floor", "ceil"):
        return f"tl.{fn}({x[0]})"
    if fn == "sqrt":
        return f"tl.sqrt_rn({x[0]})" if f32 else f"tl.sqrt({x[0]})"
    if fn == "rsqrt":
        return _div(one, f"tl.sqrt_rn({x[0]})" if f32 else f"tl.sqrt({x[0]})", f32)
    if fn == "reciprocal":
        return _div(one, x[0], f32)
    if fn == "sigmoid":
        return _div(one, f"({one} + cu.exp(-{_atom(x[0])}))", f32)
    if fn in ("max", "min"):
        return f"cu.f{fn}({x[0]}, {x[1]})"
    if fn == "sign":
        return f"cu.sign({x[0]})"
    if fn == "mod":
        return f"cu.remainder({x[0]}, {x[1]})"
    if fn == "floordiv":  # lowering emits floor(div); kept for completeness
        return f"tl.floor({_div(x[0], x[1], f32)})"
    if fn in _CU_FLOAT:
        return f"cu.{fn}({', '.join(x)})"
    raise TritonSourceError(f"{fn} on {dtype.value}")


def _int_call(fn: str, x: list[str], dtype: DType) -> str:
    if fn in ("add", "sub", "mul"):
        return f"({_atom(x[0])} {'+' if fn == 'add' else '-' if fn == 'sub' else '*'} {_atom(x[1])})"
    if fn in _BITWISE:
        return f"({_atom(x[0])} {_BITWISE[fn]} {_atom(x[1])})"
    if fn == "neg":
        return f"(-{_atom(x[0])})"
    if fn == "bitnot":
        return f"(~{_atom(x[0])})"
    if fn in ("max", "min"):
        return f"tl.{fn}imum({x[0]}, {x[1]})"
    if fn == "abs":
        return x[0] if dtype == DType.u8 else f"cu.iabs({x[0]})"
    if fn == "sign":
        return f"cu.sign({x[0]})"
    if fn in _INT_DIVISION:
        # C computes in (at least) int: widen to int32 (int64 stays), narrow the result back
        wide = DType.i64 if dtype == DType.i64 else DType.i32
        q = f"cu.{_INT_DIVISION[fn]}({_as(x[0], dtype, wide)}, {_as(x[1], dtype, wide)})"
        return _as(q, wide, dtype)
    raise TritonSourceError(f"{fn} on {dtype.value}")


def _div(a: str, b: str, f32: bool) -> str:
    return f"tl.div_rn({a}, {b})" if f32 else f"({_atom(a)} / {_atom(b)})"


def _tl(dtype: DType) -> str:
    try:
        return TL_DTYPES[dtype]
    except KeyError:
        raise TritonSourceError(f"no Triton kernel form for {dtype.value}") from None


def _as(text: str, src: DType, dst: DType) -> str:
    """``text`` (of dtype ``src``) converted to ``dst`` as C converts on assignment."""
    if src == dst:
        return text
    if dst == DType.bool:
        return _boolean(f"{_atom(text)} != 0")
    if dst in HALF:
        return round_to(text, src, dst)
    if src in HALF and dst == DType.f32:
        return text  # a half value is a float32 in registers
    return f"{_atom(text)}.to({_tl(dst)})"


def _truth(text: str, dtype: DType) -> str:
    return text if dtype == DType.bool else _boolean(f"{_atom(text)} != 0")


def _boolean(comparison: str) -> str:
    """A comparison's bool, as ``tl.where(c, True, False)``: the same ``i1`` in compiled
    code (the select folds away), and a correctly typed value in the interpreter, whose
    comparison of two 0-d operands is typed like the operands (Triton 3.9), so that
    broadcasting it against a block (``c & block``) fails there."""
    return f"tl.where({comparison}, True, False)"


def _atom(text: str) -> str:
    """``text`` as an operand of an operator: parenthesized unless it is a name, a
    number, a call or attribute chain, or already one parenthesized group."""
    t = text.strip()
    if t.startswith("(") and _closing(t, 0) == len(t) - 1:
        return t
    i = 0
    # a dotted name (or unsigned number) followed only by complete (...) / [...] groups
    while i < len(t) and (t[i].isalnum() or t[i] in "_."):
        i += 1
    if i == 0:
        return f"({t})"
    while i < len(t) and t[i] in "([":
        j = _closing(t, i)
        if j < 0:
            return f"({t})"
        i = j + 1
        while i < len(t) and (t[i].isalnum() or t[i] in "_."):  # .to(...) after a call
            i += 1
    return t if i == len(t) else f"({t})"


def _closing(t: str, i: int) -> int:
    """Index of the bracket closing ``t[i]`` (-1 if none); strings are skipped."""
    depth = 0
    quote = ""
    for k in range(i, len(t)):
        ch = t[k]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                return k
    return -1
