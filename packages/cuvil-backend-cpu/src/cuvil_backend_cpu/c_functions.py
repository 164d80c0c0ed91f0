"""The C form of every Tensor IR scalar function, one table entry each.

:data:`C_FORMS` maps each name of :data:`cuvil_ir.tensor_ir.expr.FUNCTIONS` to a
function ``(gen, args, dtype, src) -> C text``: ``args`` are the operands' C
expressions, ``dtype`` the call's result dtype and ``src`` its first operand's
(what decides the ``f`` suffix of ``<math.h>`` names and the integer forms).
``gen`` is the kernel generator (:mod:`cuvil_backend_cpu.codegen`), for constants
and for marking a kernel whose integer division can fail. A function with no C
form for a dtype raises :class:`~cuvil_backend_cpu.loop_ir.nodes.CodegenError`.
A function without an entry is written as its decomposition
(:data:`cuvil_ir.scalar_functions.TABLE`); ``test_c_functions.py`` checks that every
function of ``FUNCTIONS`` has one or the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuvil_backend_cpu.half import HALF
from cuvil_ir import scalar_functions
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E

#: (generator, operand texts, result dtype, first operand's dtype) -> C text
CForm = Callable[[Any, list[str], DType, DType], str]


class CodegenError(NotImplementedError):
    """Loop IR the C generator cannot express (a bug: lowering should have made it an extern)."""


#: the C type of a value in registers (a half type is a ``float``: [Note: half precision in C])
C_TYPES = {
    DType.f16: "float",
    DType.bf16: "float",
    DType.f32: "float",
    DType.f64: "double",
    DType.i64: "int64_t",
    DType.i32: "int32_t",
    DType.i16: "int16_t",
    DType.i8: "int8_t",
    DType.u8: "uint8_t",
    DType.bool: "uint8_t",
}

#: the C type of an element in memory, where it differs from :data:`C_TYPES`
C_STORAGE = {**C_TYPES, DType.f16: "uint16_t", DType.bf16: "uint16_t"}

_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "and": "&&",
    "or": "||",
    "bitand": "&",
    "bitor": "|",
    "bitxor": "^",
}

#: float functions that are ``<math.h>`` calls: scalar function -> the name of its
#: double form (``f`` suffix for float)
_MATH = {
    **{
        f: f
        for f in "exp expm1 log log1p log2 sqrt sin cos tan atan asinh atanh tanh floor ceil trunc pow atan2".split()
    },
    "round": "nearbyint",  # round half to even, as torch.round
}


def _sfx(src: DType) -> str:
    return "f" if C_TYPES.get(src) == "float" else ""


def _one(g: Any, d: DType) -> str:
    return str(g.const(E.Const(1.0, d)))


def _cast(g: Any, a: list[str], d: DType, src: DType) -> str:
    if d == DType.bool:
        return f"(({a[0]}) != 0)"
    if d in HALF:
        if src == d:
            return a[0]
        # through float, as c10::Half/BFloat16 convert (double and integers round twice)
        g.half = True
        return f"cu_round_{d.value}((float)({a[0]}))"
    return f"(({C_TYPES[d]})({a[0]}))"


def _infix(op: str) -> CForm:
    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        if d == DType.bool and op in ("+", "-", "*", "/"):
            # bools are 0/1 in uint8_t: true + true must stay true (1), not 2
            return f"(({a[0]} {op} {a[1]}) != 0)"
        return f"({a[0]} {op} {a[1]})"

    return form


def _minmax(cmp: str) -> CForm:
    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        if src.is_floating:  # torch propagates NaN from either side
            return f"((({a[0]}) {cmp} ({a[1]}) || ({a[0]}) != ({a[0]})) ? ({a[0]}) : ({a[1]}))"
        return f"(({a[0]}) {cmp} ({a[1]}) ? ({a[0]}) : ({a[1]}))"

    return form


def _checked(fn: str) -> CForm:
    """Integer ``floordiv``/``mod``/``fmod``: a helper that reports a zero divisor."""

    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        g.may_fail = True
        return f"(({C_TYPES[d]})cu_{fn}({a[0]}, {a[1]}, &cu_err))"

    return form


def _math(fn: str, name: str) -> CForm:
    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        if not src.is_floating:
            raise CodegenError(f"{fn} on {src.value}")
        return f"{name}{_sfx(src)}({', '.join(a)})"

    return form


def _by_kind(integer: CForm, floating: CForm) -> CForm:
    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        return (floating if src.is_floating else integer)(g, a, d, src)

    return form


def _no_float(fn: str) -> CForm:
    def form(g: Any, a: list[str], d: DType, src: DType) -> str:
        raise CodegenError(f"no C form for {fn}")  # float a // b is decomposed (rules.float_floordiv)

    return form


def _erf(g: Any, a: list[str], d: DType, src: DType) -> str:
    if src == DType.f32:
        return f"cu_erff({a[0]})"  # the prelude's vectorizable fit (erf_fit.py)
    return _math("erf", "erf")(g, a, d, src)


C_FORMS: dict[str, CForm] = {
    "cast": _cast,
    **{fn: _infix(op) for fn, op in _INFIX.items()},
    "neg": lambda g, a, d, s: f"(-{a[0]})",
    "not": lambda g, a, d, s: f"(!({a[0]}))",
    "bitnot": lambda g, a, d, s: f"(({C_TYPES[d]})~({a[0]}))",
    "xor": lambda g, a, d, s: f"((!!({a[0]})) ^ (!!({a[1]})))",
    "where": lambda g, a, d, s: f"(({a[0]}) ? ({a[1]}) : ({a[2]}))",
    "rand": lambda g, a, d, s: f"cu_rand({a[0]}, {a[1]})",
    "erf": _erf,
    "max": _minmax(">"),
    "min": _minmax("<"),
    "sign": lambda g, a, d, s: f"(({C_TYPES[d]})((({a[0]}) > 0) - (({a[0]}) < 0)))",
    "reciprocal": lambda g, a, d, s: f"({_one(g, d)} / ({a[0]}))",
    "rsqrt": lambda g, a, d, s: f"({_one(g, d)} / sqrt{_sfx(s)}({a[0]}))",
    "sigmoid": lambda g, a, d, s: f"({_one(g, d)} / ({_one(g, d)} + exp{_sfx(s)}(-({a[0]}))))",
    "abs": _by_kind(lambda g, a, d, s: f"(({a[0]}) < 0 ? -({a[0]}) : ({a[0]}))", _math("abs", "fabs")),
    "floordiv": _by_kind(_checked("floordiv"), _no_float("floordiv")),
    "mod": _by_kind(_checked("mod"), lambda g, a, d, s: f"cu_rem{_sfx(s)}({a[0]}, {a[1]})"),
    "fmod": _by_kind(_checked("fmod"), _math("fmod", "fmod")),
    **{fn: _math(fn, name) for fn, name in _MATH.items()},
}


#: functions whose float result is one of their operands (or its negation): a half
#: result needs no rounding
_EXACT = frozenset({"where", "max", "min", "neg", "abs"})


def c_call(g: Any, fn: str, args: list[str], dtype: DType, src: DType) -> str:
    """The C text of ``fn(*args)`` (a name of ``FUNCTIONS``): its form in :data:`C_FORMS`,
    or, for a function without one, its decomposition ([Note: scalar decompositions]),
    computed in the result dtype. A half result of any other arithmetic is computed in
    float and rounded (lowering computes half math in float32 itself, [Note: opmath];
    this keeps a rule that did not correct)."""
    if dtype in HALF and fn not in _EXACT and fn != "cast":
        wide = DType.f32
        g.half = True
        return f"cu_round_{dtype.value}({c_call(g, fn, args, wide, wide if src in HALF else src)})"
    form = C_FORMS.get(fn)
    if form is not None:
        return form(g, args, dtype, src)
    if not scalar_functions.decomposed(fn):
        raise CodegenError(f"no C form for {fn}")
    if src != dtype:
        args = [_cast(g, [a], dtype, src) for a in args]
    return scalar_functions.expand(
        fn,
        [f"({a})" for a in args],
        lambda name, operands: c_call(g, name, operands, dtype, dtype),
        lambda value: str(g.const(E.Const(value, dtype))),
    )


__all__ = ["C_FORMS", "C_STORAGE", "C_TYPES", "CForm", "CodegenError", "c_call"]
