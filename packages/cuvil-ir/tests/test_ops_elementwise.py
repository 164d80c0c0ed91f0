"""Elementwise ops against torch: unary, binary, where, casts, clamp and activations.

One torch call per case, checked by :func:`cuvil_ir.testing.check_case` (types, values
and graph against torch); ``test_ops.py`` checks that every declared op has a case.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuvil_ir.testing import CaseTable, In, OpCase, check_case, spec

T = torch.Tensor
X, Y, Z = In(0), In(1), In(2)
S = spec  # alias for readability in the table
CASES = CaseTable()
case = CASES.add

# -- elementwise: the first declarations --------------------------------------------------------
for _name, _fn, _first, _alt in [
    ("abs", T.__abs__, torch.float32, torch.int32),
    ("neg", torch.neg, torch.float32, torch.int64),
    ("exp", torch.exp, torch.float32, torch.int64),
    ("log", T.log, torch.float64, torch.int32),
    ("sqrt", torch.sqrt, torch.float32, torch.int64),
    ("rsqrt", T.rsqrt, torch.float32, torch.float16),
    ("erf", torch.special.erf, torch.float32, torch.int64),
    ("tanh", F.tanh, torch.float32, torch.int64),
    ("sigmoid", torch.sigmoid, torch.float32, torch.bool),
    ("relu", F.relu, torch.float32, torch.int64),
    ("silu", F.silu, torch.float32, torch.float64),
    ("logical_not", torch.logical_not, torch.float32, torch.int64),
]:
    case(f"{_name}-a", _fn, (X,), [S(3, 4, dtype=_first)], ops={_name})
    case(f"{_name}-b", _fn, (X,), [S(2, 1, 5, dtype=_alt)], ops={_name})
for _name, _fn, _reflected in [
    ("add", T.__add__, T.__radd__),
    ("sub", torch.sub, T.__rsub__),
    ("mul", T.mul, T.__rmul__),
    ("div", T.__truediv__, T.__rtruediv__),
    ("pow", torch.pow, T.__rpow__),
    ("maximum", torch.maximum, None),
    ("minimum", T.minimum, None),
    ("eq", T.__eq__, None),
    ("ne", torch.ne, None),
    ("lt", T.__lt__, None),
    ("le", torch.le, None),
    ("gt", T.gt, None),
    ("ge", T.__ge__, None),
    ("logical_and", torch.logical_and, None),
    ("logical_or", T.logical_or, None),
]:
    case(f"{_name}-broadcast", _fn, (X, Y), [S(3, 1), S(1, 4, dtype=torch.float64)], ops={_name})
    case(
        f"{_name}-int",
        _fn,
        (X, Y),
        [S(2, 3, dtype=torch.int64, low=1, high=4), S(3, dtype=torch.int32, low=1, high=4)],
        ops={_name},
    )
    if _name not in ("maximum", "minimum", "logical_and", "logical_or"):  # torch takes tensors only
        case(f"{_name}-scalar", _fn, (X, 2), [S(2, 1, 3, dtype=torch.float16)], ops={_name})
    if _reflected is not None:
        case(f"{_name}-reflected", _reflected, (X, 3), [S(4, dtype=torch.int64, low=1, high=4)], ops={_name})
case(
    "where",
    torch.where,
    (X, Y, Z),
    [S(2, 1, dtype=torch.bool), S(3), S(2, 3, dtype=torch.float64)],
    ops={"where"},
)
case("where-method", T.where, (X, Y, 0.0), [S(3, 2), S(3, 2, dtype=torch.bool)], ops={"where"})

# -- elementwise: unary ------------------------------------------------------------------------
_UNARY = [
    ("sin", torch.sin, torch.int64),
    ("cos", T.cos, torch.int64),
    ("tan", torch.tan, torch.float64),
    ("atan", torch.arctan, torch.int32),
    ("log1p", torch.log1p, torch.float64),
    ("log2", T.log2, torch.int64),
    ("expm1", torch.expm1, torch.int64),
    ("reciprocal", torch.reciprocal, torch.int64),
    ("floor", torch.floor, torch.int64),
    ("ceil", T.ceil, torch.int32),
    ("trunc", torch.fix, torch.float64),
    ("sign", torch.sign, torch.bool),
    ("bitwise_not", T.__invert__, torch.bool),
    ("hardswish", F.hardswish, torch.float64),
    ("hardsigmoid", F.hardsigmoid, torch.float64),
    ("mish", F.mish, torch.float64),
    ("logsigmoid", F.logsigmoid, torch.float64),
    ("selu", F.selu, torch.float64),
    ("square", torch.square, torch.bool),
    ("round", torch.round, torch.int64),
]
for _name, _fn, _alt in _UNARY:
    _first = torch.int64 if _name == "bitwise_not" else torch.float32
    case(f"{_name}-a", _fn, (X,), [S(3, 4, dtype=_first)], ops={_name})
    case(f"{_name}-b", _fn, (X,), [S(2, 1, 5, dtype=_alt)], ops={_name})
case("round-decimals", torch.round, (X,), [S(4, 3)], decimals=2, ops={"round"})

# -- elementwise: binary -----------------------------------------------------------------------
_INT = {"dtype": torch.int64, "low": 1, "high": 9}
case(
    "floor_divide-broadcast",
    torch.floor_divide,
    (X, Y),
    [S(3, 1, **_INT), S(1, 4, **_INT)],
    ops={"floor_divide"},
)
case("floor_divide-float", T.__floordiv__, (X, 2.5), [S(2, 3)])
case("floor_divide-reflected", T.__rfloordiv__, (X, 7), [S(4, **_INT)])
case("remainder-int", T.__mod__, (X, 3), [S(2, 5, dtype=torch.int64, low=-9, high=9)], ops={"remainder"})
case("remainder-mixed", torch.remainder, (X, Y), [S(2, 1, 3), S(4, 3, **_INT)])
case("remainder-reflected", T.__rmod__, (X, 10), [S(5, **_INT)])
case("fmod", torch.fmod, (X, Y), [S(2, 3), S(1, 3)], ops={"fmod"})
case("fmod-int", T.fmod, (X, 4), [S(6, dtype=torch.int32, low=-9, high=9)])
case("atan2", torch.atan2, (X, Y), [S(3, 1), S(1, 2)], ops={"atan2"})
case("atan2-int", torch.arctan2, (X, Y), [S(4, dtype=torch.int64), S(4, dtype=torch.int64)])
case(
    "bitwise_and",
    T.__and__,
    (X, Y),
    [S(2, 3, dtype=torch.bool), S(1, 3, dtype=torch.bool)],
    ops={"bitwise_and"},
)
case("bitwise_and-int", torch.bitwise_and, (X, 6), [S(5, dtype=torch.int64, low=0, high=16)])
case(
    "bitwise_or",
    T.__or__,
    (X, Y),
    [S(3, dtype=torch.int32, low=0, high=9), S(3, dtype=torch.int64, low=0, high=9)],
    ops={"bitwise_or"},
)
case("bitwise_or-reflected", T.__ror__, (X, 1), [S(2, 2, dtype=torch.int64, low=0, high=9)])
case(
    "bitwise_xor",
    T.__xor__,
    (X, Y),
    [S(2, 3, dtype=torch.bool), S(2, 3, dtype=torch.bool)],
    ops={"bitwise_xor"},
)
case("bitwise_xor-reflected", T.__rxor__, (X, 5), [S(4, dtype=torch.int64, low=0, high=9)])
case("logical_xor", torch.logical_xor, (X, Y), [S(2, 3), S(3, dtype=torch.bool)], ops={"logical_xor"})
case("logical_xor-int", T.logical_xor, (X, Y), [S(1, 4, dtype=torch.int64), S(3, 1, dtype=torch.int64)])
case(
    "masked_fill",
    T.masked_fill,
    (X, Y, float("-inf")),
    [S(2, 3, 4), S(1, 4, dtype=torch.bool)],
    ops={"where"},
)
case(
    "masked_fill-int",
    torch.masked_fill,
    (X, Y, 2.5),
    [S(3, 2, dtype=torch.int64), S(3, 2, dtype=torch.bool)],
    ops={"where", "cast"},
)
case(
    "masked_fill-tensor-value",
    T.masked_fill,
    (X, Y, Z),
    [S(2, 3, dtype=torch.float16), S(2, 3, dtype=torch.bool), S(dtype=torch.float32)],
)

# -- casts ------------------------------------------------------------------------------------------
case("to-dtype", T.to, (X, torch.float16), [S(2, 3)], ops={"cast"})
case("to-kw", T.to, (X,), [S(3, 1)], dtype=torch.int32, device="cpu", ops={"cast"})
case("to-same", T.to, (X, torch.float32), [S(2, 3)], ops=set())
case("to-device-same", T.to, (X, "cpu"), [S(4)], ops=set())
case("to-copy", T.to, (X, torch.float32), [S(2)], copy=True, ops={"cast"})
case("to-other", T.to, (X, Y), [S(2, 3, dtype=torch.int64), S(1, dtype=torch.float64)], ops={"cast"})
case("float", T.float, (X,), [S(2, 3, dtype=torch.int64)], ops={"cast"})
case("half", T.half, (X,), [S(4, 1)], ops={"cast"})
case("double", T.double, (X,), [S(3, dtype=torch.bool)], ops={"cast"})
case("bfloat16", T.bfloat16, (X,), [S(3, 2)], ops={"cast"})
case("long", T.long, (X,), [S(2, 2)], ops={"cast"})
case("int", T.int, (X,), [S(5, dtype=torch.int64)], ops={"cast"})
case("bool", T.bool, (X,), [S(2, 3, dtype=torch.int64, low=-1, high=2)], ops={"cast"})
case("type_as", T.type_as, (X, Y), [S(2, 3), S(2, dtype=torch.int32)], ops={"cast"})
case("type-dtype", T.type, (X, torch.float64), [S(3)], ops={"cast"})
case("cpu", T.cpu, (X,), [S(3)], ops=set())

# -- clamp and activations ----------------------------------------------------------------------
case("clamp", torch.clamp, (X, -0.5, 0.5), [S(3, 4)], ops={"clamp"})
case("clamp-min-int", T.clamp, (X,), [S(2, 1, 3, dtype=torch.int64)], min=0, ops={"clamp"})
case("clamp-promote", torch.clamp, (X,), [S(4, dtype=torch.int64)], min=0.5, ops={"clamp"})
case("clamp-tensor", torch.clamp, (X,), [S(2, 3), S(1, 3)], max=Y, ops={"minimum"})
case("clamp-tensors", torch.clamp, (X, Y, Z), [S(2, 3), S(3), S(2, 1)], ops={"maximum", "minimum"})
case("clip", T.clip, (X, 0.0), [S(5, 2)], ops={"clamp"})
case("clamp_min", torch.clamp_min, (X, 0.1), [S(2, 3)], ops={"clamp"})
case("clamp_max", T.clamp_max, (X, -0.1), [S(3, 1)], ops={"clamp"})
case("hardtanh", F.hardtanh, (X, -2.0, 2.0), [S(3, 4)], ops={"clamp"})
case("relu6", F.relu6, (X,), [S(2, 5)], ops={"clamp"})
case("gelu", F.gelu, (X,), [S(3, 4)], ops={"gelu"})
case("gelu-tanh", F.gelu, (X,), [S(2, 1, 3, dtype=torch.float64)], approximate="tanh", ops={"gelu"})
case("leaky_relu", F.leaky_relu, (X,), [S(3, 4)], ops={"leaky_relu"})
case("leaky_relu-slope", F.leaky_relu, (X, 0.2), [S(2, 6)], ops={"leaky_relu"})
case("elu", F.elu, (X,), [S(4, 3)], ops={"elu"})
case("elu-alpha", F.elu, (X,), [S(1, 5)], alpha=0.5, ops={"elu"})
case("softplus", F.softplus, (X,), [S(3, 4)], ops={"softplus"})
case("softplus-beta", F.softplus, (X, 2.0, 1.0), [S(2, 1, 3)], ops={"softplus"})
case("asinh", torch.asinh, (X,), [S(3, 4)], ops={"asinh"})
case("arcsinh-f64", T.arcsinh, (X,), [S(2, 5, dtype=torch.float64)], ops={"asinh"})
case("atanh", torch.atanh, (X,), [S(3, 4)], ops={"atanh"})
case("arctanh-f64", T.arctanh, (X,), [S(2, 5, dtype=torch.float64)], ops={"atanh"})
case("logit", torch.logit, (X,), [S(3, 4)], ops={"logit"})
case("logit-eps", T.logit, (X, 0.05), [S(2, 1, 3, dtype=torch.float64)], ops={"logit"})
case("dropout-eval", F.dropout, (X, 0.3, False), [S(3, 4)], ops=set())
case("dropout-train", F.dropout, (X, 0.5, True), [S(20, 30)], check="dropout", ops={"dropout"})
case("dropout-train-2", F.dropout, (X, 0.25), [S(8, 3, 20)], check="dropout", ops={"dropout"})
case("torch-dropout-eval", torch.dropout, (X, 0.2, False), [S(4)], ops=set())
case("dropout2d-eval", F.dropout2d, (X, 0.5, False), [S(1, 2, 3, 3)], ops=set())


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_op(c: OpCase) -> None:
    check_case(c)
