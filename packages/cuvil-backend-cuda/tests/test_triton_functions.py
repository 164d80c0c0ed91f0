"""The Triton text of every scalar function (cuvil_ir.triton_source.functions) and the
device library it calls (cuvil_backend_cuda.devicelib), against torch.

Each (function, dtypes) case becomes a one-block kernel run by Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors, the interpreted ``cu`` namespace) on edge
values: NaN, infinities, -0.0, negative numbers, zero divisors, integer extremes.
Integers and bools must match exactly; floats within the ulps of ``_ULPS`` (0 for
arithmetic, rounding, casts, fmod/remainder; a few for the interpreted transcendental
fallbacks; see there). ``rand`` must equal the CPU target's C ``cu_rand`` bit for bit.
The last test compiles (no interpreter) one kernel holding every case and every
compiled ``cu`` function to PTX for sm_90.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import linecache
import math
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cuvil_backend_cpu.codegen import PRELUDE
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir.expr import FUNCTIONS
from cuvil_ir.triton_source.functions import HALF, SIGNATURE_TYPES, TL_DTYPES, call, const

triton = pytest.importorskip("triton")

from cuvil_backend_cuda import devicelib  # noqa: E402 (after the importorskip)

F32, F64, I64, I32, I16, I8, U8, BOOL = (
    DType.f32,
    DType.f64,
    DType.i64,
    DType.i32,
    DType.i16,
    DType.i8,
    DType.u8,
    DType.bool,
)
FLOATS = [F32, F64]
INTS = [I64, I32, I16, I8, U8]
ALL = [*FLOATS, *INTS, BOOL]

# -- the cases: (function, argument dtypes, result dtype) ------------------------------
_FLOAT_UNARY = "exp expm1 log log1p log2 sqrt rsqrt sin cos tan atan asinh atanh tanh erf sigmoid floor ceil trunc round reciprocal"
CASES: list[tuple[str, tuple[DType, ...], DType]] = [
    *((f, (d,), d) for f in _FLOAT_UNARY.split() for d in FLOATS),
    *((f, (d,), d) for f in ("neg", "abs") for d in FLOATS + INTS),
    *(("sign", (d,), d) for d in ALL),
    ("not", (BOOL,), BOOL),
    *(("bitnot", (d,), d) for d in [*INTS, BOOL]),
    *(("cast", (s,), d) for s in ALL for d in ALL),
    *((f, (d, d), d) for f in ("add", "sub", "mul", "max", "min") for d in ALL),
    *((f, (d, d), d) for f in ("div", "floordiv", "mod", "fmod") for d in FLOATS + INTS),
    *((f, (d, d), d) for f in ("pow", "atan2") for d in FLOATS),
    *((f, (BOOL, BOOL), BOOL) for f in ("and", "or", "xor")),
    *((f, (d, d), d) for f in ("bitand", "bitor", "bitxor") for d in [*INTS, BOOL]),
    *((f, (d, d), BOOL) for f in ("eq", "ne", "lt", "le", "gt", "ge") for d in ALL),
    *(("where", (BOOL, d, d), d) for d in ALL),
]

#: allowed error in ulps for float results; absent: exact. The interpreted fallbacks
#: compute float32 in float64 and round once (<= 1 ulp from the correctly rounded
#: value); torch's own float32 functions are within 1 ulp of it, hence 2. In float64,
#: numpy's exp/log/sin/cos and the composed expm1/log1p/tanh/tan/atan/atan2 are within
#: a few ulps, pow (double-double log and product) too.
_ULPS: dict[tuple[str, DType], int] = {
    **{
        (f, F32): 2
        for f in "exp expm1 log log1p log2 sin cos tan atan asinh atanh tanh erf sigmoid pow atan2".split()
    },
    **{
        (f, F64): 4
        for f in "exp expm1 log log1p log2 sin cos tan atan asinh atanh tanh erf sigmoid atan2 pow".split()
    },
}
#: max/min: C's form picks ``b`` when a == b, torch may pick the other zero
_ZERO_SIGN_FREE = {"max", "min"}


def _case_id(case: tuple[str, tuple[DType, ...], DType]) -> str:
    fn, args, out = case
    return f"{fn}-{'-'.join(d.value for d in args)}-{out.value}"


# -- inputs ------------------------------------------------------------------------------
_FLOAT_EDGES = [
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -3.0, -7.25, 1e-3, -1e-3, 1e-30, -3e-20,
    0.75, 100.0, -100.0, 88.5, -88.5, 1e30, -1e30, 0.7853981633974483, 1.5707963267948966,
    math.inf, -math.inf, math.nan,
]  # fmt: skip


def _float_values(dtype: DType, n_random: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    rnd = torch.cat([torch.randn(n_random, generator=g, dtype=torch.float64) * 4,
                     (torch.rand(n_random, generator=g, dtype=torch.float64) - 0.5) * 1e-5])  # fmt: skip
    return _FLOAT_EDGES + rnd.tolist()


def _int_values(dtype: DType) -> list[int]:
    if dtype == BOOL:
        return [0, 1]
    if dtype == U8:
        return [0, 1, 2, 3, 7, 100, 127, 128, 200, 254, 255]
    info = torch.iinfo(dtype.torch)
    return [0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, info.min, info.min + 1, info.max, info.max - 1]


def _values(dtype: DType, n_random: int = 24, seed: int = 0) -> list[Any]:
    if dtype.is_floating:
        return _float_values(dtype, n_random, seed)
    return _int_values(dtype)


def _cast_values(src: DType, dst: DType) -> list[Any]:
    """Inputs whose conversion C defines (float -> int only in range)."""
    if not (src.is_floating and dst != BOOL and not dst.is_floating):
        return _values(src)
    info = torch.iinfo(dst.torch)
    vals = [
        0.0,
        -0.0,
        0.5,
        1.5,
        2.7,
        99.9,
        126.99,
        -0.5,
        -1.5,
        -2.7,
        -99.9,
        -127.9,
        float(info.max) / 2 + 0.5,
    ]
    return [v for v in vals if info.min <= math.trunc(v) <= info.max]


def _inputs(case: tuple[str, tuple[DType, ...], DType]) -> list[torch.Tensor]:
    fn, args, out = case
    if fn == "cast":
        columns: list[list[Any]] = [_cast_values(args[0], out)]
    elif len(args) == 1:
        columns = [_values(args[0], 48)]
    else:
        per_arg = [_values(d, 0) if d.is_floating else _values(d) for d in args]
        if fn == "where":
            per_arg[1] = per_arg[1][::2] if args[1].is_floating else per_arg[1]
            per_arg[2] = per_arg[2][1::2] if args[2].is_floating else per_arg[2]
        rows = list(itertools.product(*per_arg))
        if args[-1].is_floating:  # and random pairs (positive bases for pow: real results)
            a, b = _float_values(args[0], 64, 1)[-128:], _float_values(args[1], 64, 2)[-128:]
            rows += [(c, abs(x) if fn == "pow" else x, y) if fn == "where" else (abs(x) if fn == "pow" else x, y)
                     for c, x, y in zip(itertools.cycle([True, False]), a, b)]  # fmt: skip
            if fn == "where":
                rows = [r if len(r) == 3 else (True, *r) for r in rows]
        columns = [list(c) for c in zip(*rows)]
    return [torch.tensor(col, dtype=d.torch) for col, d in zip(columns, args)]


# -- the kernels -----------------------------------------------------------------------
_names = itertools.count()


def _exec_kernel(src: str, cu_ns: types.ModuleType) -> Any:
    """``kernel`` of the generated source ``src`` (registered in linecache for inspect)."""
    name = f"cuvil_triton_test_{next(_names)}"
    filename = f"<{name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns: dict[str, Any] = {"__name__": name, "cu": cu_ns}
    exec(compile(src, filename, "exec"), ns)
    return ns["kernel"]


def _run(expr: str, inputs: Sequence[torch.Tensor], out_dtype: DType) -> torch.Tensor:
    """``expr`` (over ``a0, a1 ...``) on ``inputs``, in the interpreter."""
    params = "".join(f", a{k}_ptr" for k in range(len(inputs)))
    loads = "".join(f"    a{k} = tl.load(a{k}_ptr + offs, mask=m)\n" for k in range(len(inputs)))
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def kernel(o_ptr{params}, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n    m = offs < n\n"
        f"{loads}    tl.store(o_ptr + offs, tl.broadcast_to({expr}, [BLOCK]), mask=m)\n"
    )
    kernel = _exec_kernel(src, devicelib.namespace(True))
    n = len(inputs[0]) if inputs else 1
    out = torch.empty(n, dtype=out_dtype.torch)
    with np.errstate(all="ignore"):
        kernel[(1,)](out, *inputs, n, BLOCK=triton.next_power_of_2(n))
    return out


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton reads TRITON_INTERPRET when ``triton.jit`` decorates the generated kernel."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# -- the oracle ------------------------------------------------------------------------
def _wrap(v: int, dtype: DType) -> int:
    bits = torch.iinfo(dtype.torch).bits
    if dtype == U8:
        return v % 256
    return (v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)


def _int_division(fn: str, a: int, b: int) -> int:
    """Python's (floordiv, mod) and C's (fmod, div) integer division; 0 for a zero divisor."""
    if b == 0:
        return 0
    if fn == "floordiv":
        return a // b
    if fn == "mod":
        return a % b
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q if fn == "div" else a - q * b


_TORCH: dict[str, Callable[..., torch.Tensor]] = {
    **{f: getattr(torch, f) for f in _FLOAT_UNARY.split() + ["neg", "abs", "sign", "atan2", "pow", "fmod"]},
    "not": torch.logical_not,
    "bitnot": torch.bitwise_not,
    "add": torch.add,
    "sub": lambda a, b: a ^ b if a.dtype == torch.bool else a - b,  # C: (a - b) != 0
    "mul": torch.mul,
    "div": torch.div,
    "floordiv": lambda a, b: torch.floor(a / b),  # float: lowering's floor(div)
    "mod": torch.remainder,
    "max": torch.maximum,
    "min": torch.minimum,
    **{f: getattr(torch, f"logical_{f}") for f in ("and", "or", "xor")},
    **{f: getattr(torch, f"bitwise_{f[3:]}") for f in ("bitand", "bitor", "bitxor")},
    **{f: getattr(torch, f) for f in ("eq", "ne", "lt", "le", "gt", "ge")},
    "where": torch.where,
}


def _expected(case: tuple[str, tuple[DType, ...], DType], inputs: list[torch.Tensor]) -> torch.Tensor:
    fn, args, out = case
    if fn == "cast":
        return inputs[0].to(out.torch)
    if fn in ("floordiv", "mod", "fmod", "div") and out.is_integer:
        a, b = inputs
        want = [_wrap(_int_division(fn, x, y), out) for x, y in zip(a.tolist(), b.tolist())]
        safe = (b != 0) & (b != -1) if out != U8 else b != 0
        if fn != "div":  # torch agrees where it does not trap
            ref = {"floordiv": torch.floor_divide, "mod": torch.remainder, "fmod": torch.fmod}[fn]
            assert torch.equal(ref(a[safe], b[safe]), torch.tensor(want, dtype=out.torch)[safe])
        return torch.tensor(want, dtype=out.torch)
    if fn in ("sqrt", "rsqrt") or (fn in ("fmod", "mod") and out.is_floating):
        # torch's sqrt is not always correctly rounded, and its float fmod is not exact
        # (fmod(1e30, 1e-30) is NaN in float32): C's sqrt and fmod (numpy's) are
        x = [t.numpy() for t in inputs]
        with np.errstate(all="ignore"):
            if fn == "mod":
                r = np.fmod(x[0], x[1])
                r = np.where((r != 0) & ((r < 0) != (x[1] < 0)), r + x[1], r)
            else:
                r = np.fmod(x[0], x[1]) if fn == "fmod" else np.sqrt(x[0])
            if fn == "rsqrt":
                r = np.ones_like(r) / r
        return torch.from_numpy(np.asarray(r, dtype=x[0].dtype))
    return _TORCH[fn](*inputs).to(out.torch)


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Floats as integers in the order of their values (adjacent floats differ by 1)."""
    bits = x.view(torch.int32 if x.dtype == torch.float32 else torch.int64).to(torch.int64)
    sign_mask = torch.iinfo(torch.int32 if x.dtype == torch.float32 else torch.int64).max
    return torch.where(bits < 0, -(bits & sign_mask), bits)


def _compare(got: torch.Tensor, want: torch.Tensor, ulps: int, zero_sign: bool, what: str) -> None:
    assert got.dtype == want.dtype, what
    if not got.dtype.is_floating_point:
        bad = got != want
        assert not bad.any(), (
            f"{what}: got {got[bad][:8].tolist()} want {want[bad][:8].tolist()} at {bad.nonzero()[:8].flatten().tolist()}"
        )
        return
    nan_g, nan_w = got.isnan(), want.isnan()
    assert torch.equal(nan_g, nan_w), f"{what}: NaN at {(nan_g ^ nan_w).nonzero().flatten()[:8].tolist()}"
    ok = ~nan_w
    g, w = got[ok], want[ok]
    inf = w.isinf() | g.isinf()
    assert torch.equal(g[inf], w[inf]), (
        f"{what}: infinities got {g[inf].tolist()[:8]} want {w[inf].tolist()[:8]}"
    )
    dist = (_ordered(g[~inf]) - _ordered(w[~inf])).abs()
    allowed = torch.full_like(dist, ulps)
    excess = dist - allowed
    k = int(excess.argmax()) if dist.numel() else 0
    assert not dist.numel() or int(excess[k]) <= 0, (
        f"{what}: {int(dist[k])} ulps (allowed {int(allowed[k])}): got {g[~inf][k].item()!r} want {w[~inf][k].item()!r}"
    )
    if zero_sign:
        z = (w == 0) & (g == 0)
        assert torch.equal(torch.signbit(g[z]), torch.signbit(w[z])), f"{what}: sign of zero"


# -- tests ---------------------------------------------------------------------------------
def test_every_function_has_cases() -> None:
    assert {fn for fn, _, _ in CASES} | {"rand"} == set(FUNCTIONS)
    assert set(TL_DTYPES) == set(SIGNATURE_TYPES) == set(ALL) | HALF


# -- the C generator's forms of the same cases, compiled once ------------------------------
CFunction = Callable[[list[torch.Tensor]], torch.Tensor]
Case = tuple[str, tuple[DType, ...], DType]
#: C forms outside what lowering emits (and C leaves undefined): integer true division
#: traps on a zero divisor, bitnot of a bool is 254/255; float floordiv has no C form
_NO_C_FORM = {("div", d) for d in INTS} | {("bitnot", BOOL), ("floordiv", F32), ("floordiv", F64)}
#: the C erff is a rational approximation (cu_erff), glibc's functions are within 1 ulp
_C_ULPS = {**_ULPS, ("erf", F32): 4}


@pytest.fixture(scope="module")
def c_forms(tmp_path_factory: pytest.TempPathFactory) -> dict[Case, CFunction]:
    """Each case as the CPU target's C generator writes it (``_Gen.call``), on arrays."""
    from cuvil_backend_cpu.codegen import C_TYPES, _Gen
    from cuvil_ir.tensor_ir import expr as E

    gen = _Gen(None, simd_math=False, parallel_threshold=0)  # type: ignore[arg-type]
    cases = [c for c in CASES if (c[0], c[2]) not in _NO_C_FORM]
    parts = [PRELUDE]
    for k, (fn, args, out) in enumerate(cases):
        expr = gen.call(E.Call(fn, tuple(E.Var(f"a{i}", d) for i, d in enumerate(args)), out))
        params = "".join(f"const {C_TYPES[d]}* p{i}, " for i, d in enumerate(args))
        loads = "".join(f"const {C_TYPES[d]} a{i} = p{i}[i]; " for i, d in enumerate(args))
        parts.append(
            f"void case_{k}({params}{C_TYPES[out]}* out, int64_t n) {{\n  int cu_err = 0; (void)cu_err;\n"
            f"  for (int64_t i = 0; i < n; ++i) {{ {loads}out[i] = {expr}; }}\n}}"
        )
    d = tmp_path_factory.mktemp("c_forms")
    (d / "forms.c").write_text("\n".join(parts) + "\n")
    flags = ["-O1", "-fwrapv", "-ffp-contract=off", "-shared", "-fPIC"]
    subprocess.run(["gcc", *flags, "-o", str(d / "forms.so"), str(d / "forms.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(d / "forms.so"))

    def bind(k: int, out: DType) -> CFunction:
        f = getattr(lib, f"case_{k}")

        def run(inputs: list[torch.Tensor]) -> torch.Tensor:
            o = torch.empty(len(inputs[0]), dtype=out.torch)
            ptrs = [ctypes.c_void_p(t.data_ptr()) for t in [*inputs, o]]
            f(*ptrs, ctypes.c_int64(len(o)))
            return o

        return run

    return {case: bind(k, case[2]) for k, case in enumerate(cases)}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.usefixtures("interpret")
def test_function(case: Case, c_forms: dict[Case, CFunction]) -> None:
    """Against torch, and against the C generator's form of the same function."""
    fn, args, out = case
    inputs = _inputs(case)
    expr = call(fn, [f"a{k}" for k in range(len(args))], args, out)
    got = _run(expr, inputs, out)
    want = _expected(case, inputs)
    tol = _ULPS.get((fn, out), 0)
    _compare(got, want, tol, fn not in _ZERO_SIGN_FREE, f"{_case_id(case)} `{expr}`")
    if case in c_forms:  # the same value as the C form, signed zeros included
        c_tol = _C_ULPS.get((fn, out), 0)
        _compare(got, c_forms[case](inputs), c_tol, True, f"{_case_id(case)} vs C")


#: every float32 function again in each half type, and casts between the half types and
#: every other: [Note: half precision in Triton] (float32 in registers, rounded once)
HALF_CASES: list[Case] = [
    *((fn, tuple(h for _ in args), h if out == F32 else out) for fn, args, out in CASES if set(args) == {F32} for h in sorted(HALF, key=str)),
    *(("cast", (h,), d) for h in sorted(HALF, key=str) for d in [*ALL, *HALF] if d != h),
    *(("cast", (d,), h) for h in sorted(HALF, key=str) for d in ALL),
]  # fmt: skip


def _run_half(expr: str, inputs: Sequence[torch.Tensor], out: DType) -> torch.Tensor:
    """``expr`` on half ``inputs`` loaded as the generated kernels load them (widened to
    float32), its half result stored as they store it."""
    widen = {DType.bf16: "cu.widen_bf16({})", DType.f16: "{}.to(tl.float32)"}
    narrow = {DType.bf16: "cu.to_bf16({})", DType.f16: "{}.to(tl.float16)"}
    params = "".join(f", a{k}_ptr" for k in range(len(inputs)))
    loads = ""
    for k, t in enumerate(inputs):
        load = f"tl.load(a{k}_ptr + offs, mask=m)"
        dt = DType.from_torch(t.dtype)
        loads += f"    a{k} = {widen[dt].format(load) if dt in HALF else load}\n"
    value = f"tl.broadcast_to({expr}, [BLOCK])"
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def kernel(o_ptr{params}, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n    m = offs < n\n"
        f"{loads}    tl.store(o_ptr + offs, {narrow[out].format(value) if out in HALF else value}, mask=m)\n"
    )
    kernel = _exec_kernel(src, devicelib.namespace(True))
    n = len(inputs[0])
    result = torch.empty(n, dtype=out.torch)
    with np.errstate(all="ignore"):
        kernel[(1,)](result, *inputs, n, BLOCK=triton.next_power_of_2(n))
    return result


@pytest.mark.parametrize("case", HALF_CASES, ids=_case_id)
@pytest.mark.usefixtures("interpret")
def test_function_in_half_precision(case: Case) -> None:
    """Against the float32 function of the widened operands, rounded once to the half type
    (eager's opmath); a function that is not exact in float32 may round to the
    neighbouring half value."""
    fn, args, out = case
    wide = tuple(F32 if d in HALF else d for d in args)
    if fn == "cast":
        inputs = [t.to(args[0].torch) for t in _inputs(("cast", wide, out if out not in HALF else F32))]
    else:
        inputs = [t.to(d.torch) for t, d in zip(_inputs((fn, wide, F32 if out in HALF else out)), args)]
    expr = call(fn, [f"a{k}" for k in range(len(args))], args, out)
    got = _run_half(expr, inputs, out)
    if fn == "cast":
        want = _expected(case, inputs)
    else:  # the float32 function of the widened operands, rounded once
        wide_out = F32 if out in HALF else out
        want = _expected((fn, wide, wide_out), [t.float() for t in inputs]).to(out.torch)
    tol = 1 if (fn, F32) in _ULPS else 0
    if got.dtype in (torch.float16, torch.bfloat16):
        got32, want32 = got.float(), want.float()
        nan = want32.isnan()
        assert torch.equal(got32.isnan(), nan), f"{_case_id(case)} `{expr}`: NaN"
        step = (
            torch.nextafter(want.abs(), torch.tensor(float("inf"), dtype=want.dtype)).float() - want32.abs()
        )
        err = (got32 - want32).abs()[~nan & ~want32.isinf()]
        assert torch.equal(got32[want32.isinf()], want32[want32.isinf()]), f"{_case_id(case)}: infinities"
        assert (err <= tol * step[~nan & ~want32.isinf()]).all(), (
            f"{_case_id(case)} `{expr}`: {got32[~nan][err.argmax()]} vs {want32[~nan][err.argmax()]}"
        )
    else:
        _compare(got, want, 0, False, f"{_case_id(case)} `{expr}`")


@pytest.mark.parametrize("case", [c for c in CASES if len(c[1]) == 2 and c[0] != "floordiv"], ids=_case_id)
@pytest.mark.usefixtures("interpret")
def test_function_of_a_constant(case: tuple[str, tuple[DType, ...], DType]) -> None:
    """The second operand a 0-d constant from ``const``: broadcast, no promotion."""
    fn, args, out = case
    a = _inputs(case)[0]
    for value in [v for v in _values(args[1], 0) if not (fn in ("mod", "fmod", "div") and v == 0)][:6]:
        expr = call(fn, ["a0", const(value, args[1])], args, out)
        got = _run(expr, [a], out)
        want = _expected(case, [a, torch.full_like(a, value, dtype=args[1].torch)])
        tol = _ULPS.get((fn, out), 0)
        what = f"{fn}(a, {value}) `{expr}`"
        _compare(got, want, tol, fn not in _ZERO_SIGN_FREE, what)


@pytest.mark.usefixtures("interpret")
def test_constants() -> None:
    values: dict[DType, list[Any]] = {
        F32: [0.0, -0.0, 0.1, -1.5, 3.4028234663852886e38, 1e-45, math.inf, -math.inf, math.nan],
        F64: [0.0, -0.0, 0.1, 1 / 3, 1e-300, 5e-324, 1.7976931348623157e308, math.inf, -math.inf, math.nan],
        I64: [0, -1, 2**62 + 12345, 2**63 - 1, -(2**63)],
        I32: [0, -1, 2**31 - 1, -(2**31)],
        I16: [-(2**15), 2**15 - 1, 7],
        I8: [-128, 127, -3],
        U8: [0, 200, 255],
        BOOL: [False, True],
    }
    for dtype, vals in values.items():
        for v in vals:
            got = _run(const(v, dtype), [torch.zeros(4)], dtype)
            want = torch.full((4,), v, dtype=dtype.torch)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, v, got)
    assert const(300, I8) == "tl.full([], 44, tl.int8)"  # wraps as C's (int8_t)300


@pytest.mark.usefixtures("interpret")
def test_scalar_operands() -> None:
    """Comparisons of 0-d values (constants, scalar arguments) combined with blocks: the
    interpreter types such a comparison like its operands, which ``call`` works around."""
    x = torch.tensor([-1.0, 0.0, 2.0, math.nan])
    c = call("lt", [const(1.0, F32), const(2.0, F32)], [F32, F32], BOOL)  # True, 0-d
    pos = call("gt", ["a0", const(0.0, F32)], [F32, F32], BOOL)
    for fn, want in [("and", [False, False, True, False]), ("xor", [True, True, False, True])]:
        got = _run(call(fn, [c, pos], [BOOL, BOOL], BOOL), [x], BOOL)
        assert got.tolist() == want, fn
    got = _run(call("where", [c, "a0", const(5.0, F32)], [BOOL, F32, F32], F32), [x], F32)
    assert got[:3].tolist() == x[:3].tolist() and got[3].isnan()
    big = call("max", [const(3.0, F32), const(-1.0, F32)], [F32, F32], F32)  # all-constant: 0-d
    got = _run(call("pow", ["a0", big], [F32, F32], F32), [x], F32)
    assert got[:3].tolist() == [-1.0, 0.0, 8.0] and got[3].isnan()


@pytest.mark.usefixtures("interpret")
def test_prod_combine() -> None:
    """``cu.prod_combine``, the emitter's product reduction, runs in the interpreter."""
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def kernel(o_ptr, x_ptr):\n"
        "    x = tl.load(x_ptr + tl.arange(0, 4)[:, None] * 8 + tl.arange(0, 8)[None, :])\n"
        "    tl.store(o_ptr + tl.arange(0, 4), tl.reduce(x, 1, cu.prod_combine))\n"
    )
    kernel = _exec_kernel(src, devicelib.namespace(True))
    x = torch.linspace(0.5, 1.5, 32, dtype=torch.float64)
    out = torch.empty(4, dtype=torch.float64)
    kernel[(1,)](out, x)
    torch.testing.assert_close(out, x.view(4, 8).prod(1))


@pytest.mark.usefixtures("interpret")
def test_welford_combine() -> None:
    """``cu.welford_combine`` merges per-lane (mean, M2, count) partials into the row's
    mean and sum of squared deviations (the looped variance reduction)."""
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def kernel(m_ptr, q_ptr, x_ptr):\n"
        "    x = tl.load(x_ptr + tl.arange(0, 4)[:, None] * 8 + tl.arange(0, 8)[None, :])\n"
        "    m, q, c = tl.reduce((x, x * 0.0, x * 0.0 + 1.0), 1, cu.welford_combine)\n"
        "    tl.store(m_ptr + tl.arange(0, 4), m)\n"
        "    tl.store(q_ptr + tl.arange(0, 4), q)\n"
    )
    kernel = _exec_kernel(src, devicelib.namespace(True))
    x = torch.randn(32, dtype=torch.float64) * 3 + 1
    m, q = torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.float64)
    kernel[(1,)](m, q, x)
    rows = x.view(4, 8)
    torch.testing.assert_close(m, rows.mean(1))
    torch.testing.assert_close(q, rows.var(1, correction=0) * 8)


# -- rand against the C cu_rand ---------------------------------------------------------
@pytest.fixture(scope="module")
def c_rand(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, list[int]], torch.Tensor]:
    d = tmp_path_factory.mktemp("cu_rand")
    src = d / "rand.c"
    src.write_text(
        PRELUDE + "void fill(int64_t seed, const int64_t* c, float* out, int64_t n) {\n"
        "  for (int64_t i = 0; i < n; ++i) out[i] = cu_rand(seed, c[i]);\n}\n"
    )
    lib_path = d / "rand.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib_path), str(src), "-lm"], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.fill.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def fill(seed: int, counters: list[int]) -> torch.Tensor:
        c = torch.tensor(counters, dtype=torch.int64)
        out = torch.empty(len(counters), dtype=torch.float32)
        lib.fill(seed, c.data_ptr(), out.data_ptr(), len(counters))
        return out

    return fill


@pytest.mark.usefixtures("interpret")
def test_rand_matches_c(c_rand: Callable[[int, list[int]], torch.Tensor]) -> None:
    counters = list(range(40)) + [2**32 - 1, 2**32, 2**32 + 7, 2**40 + 17, 2**62 + 5, 2**63 - 1, -1, -(2**63)]
    c = torch.tensor(counters, dtype=torch.int64)
    for seed in [0, 1, 42, -1, -7, 2**32 + 3, 2**40 + 5, 2**63 - 1, -(2**63)]:
        want = c_rand(seed, counters)
        got = _run(call("rand", [const(seed, I64), "a0"], [I64, I64], F32), [c], F32)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), seed
        s = torch.full_like(c, seed)
        got = _run(call("rand", ["a0", "a1"], [I64, I64], F32), [s, c], F32)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), seed
    assert ((want >= 0) & (want < 1)).all() and len(set(want.tolist())) > 40


# -- compiled: PTX for sm_90 ---------------------------------------------------------------
def _ptx_kernel_source() -> tuple[str, dict[str, str]]:
    """One kernel with every case (operands loaded, and a constant operand for the
    binary ones), each stored to its own slice of the output of its dtype."""
    order = ALL
    lines = []
    for d in order:
        for k in range(3):
            lines.append(f"    {d.value}_{k} = tl.load(p_{d.value} + {k} * BLOCK + offs, mask=m)")
    slot = dict.fromkeys(order, 0)
    for fn, args, out in CASES:
        forms = [[f"{d.value}_{k}" for k, d in enumerate(args)]]
        if len(args) == 2:
            forms.append([forms[0][0], const(3, args[1])])
        for operands in forms:
            expr = call(fn, operands, args, out)
            lines.append(f"    tl.store(o_{out.value} + {slot[out]} * BLOCK + offs, {expr}, mask=m)")
            slot[out] += 1
    for operands in (["i64_0", "i64_1"], [const(-(2**63), I64), "i64_1"]):
        lines.append(
            f"    tl.store(o_f32 + {slot[F32]} * BLOCK + offs, {call('rand', operands, [I64, I64], F32)}, mask=m)"
        )
        slot[F32] += 1
    lines.append(
        f"    tl.store(o_f64 + {slot[F64]} * BLOCK + offs, tl.reduce(f64_0, 0, cu.prod_combine), mask=m)"
    )
    slot[F64] += 1
    lines.append("    wm, wq, wc = tl.reduce((f64_0, f64_0, f64_0), 0, cu.welford_combine)")
    lines.append(f"    tl.store(o_f64 + {slot[F64]} * BLOCK + offs, wm + wq + wc, mask=m)")
    # the half-precision conversions ([Note: half precision in Triton])
    halves = "cu.round_f16(f32_0) + cu.round_bf16(f32_1) + cu.widen_bf16(cu.to_bf16(f32_2))"
    lines.append(f"    tl.store(o_f32 + {slot[F32]} * BLOCK + offs, {halves}, mask=m)")
    slot[F32] += 1
    params = ", ".join([f"p_{d.value}" for d in order] + [f"o_{d.value}" for d in order])
    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        f"def kernel({params}, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n    m = offs < n\n" + "\n".join(lines) + "\n"
    )
    signature = {f"p_{d.value}": "*" + SIGNATURE_TYPES[d] for d in order}
    signature |= {f"o_{d.value}": "*" + SIGNATURE_TYPES[d] for d in order}
    signature |= {"n": "i64", "BLOCK": "constexpr"}
    return src, signature


#: compiles the kernel in a fresh process: once kernels have run in Triton's interpreter,
#: this process's ``tl`` cannot compile (the cuda target's PTX stage uses a worker too)
_PTX_SCRIPT = """
import json, linecache, sys
import triton
from cuvil_backend_cuda import devicelib
src, signature = json.load(open(sys.argv[1]))
name = "<ptx test kernel>"
linecache.cache[name] = (len(src), None, src.splitlines(True), name)
ns = {"cu": devicelib.namespace(False)}
exec(compile(src, name, "exec"), ns)
ast_source = triton.compiler.ASTSource(ns["kernel"], signature=signature, constexprs={"BLOCK": 32})
target = triton.backends.compiler.GPUTarget("cuda", 90, 32)
options = {"num_warps": 1, "enable_fp_fusion": False}
print(triton.compile(ast_source, target=target, options=options).asm["ptx"])
"""


def test_compiles_to_ptx_for_sm90(tmp_path: Path) -> None:
    src, signature = _ptx_kernel_source()
    for name in devicelib.NAMES:  # every device function is reached by some call form
        assert re.search(rf"\bcu\.{name}\b", src), name
    spec = tmp_path / "kernel.json"
    spec.write_text(json.dumps([src, signature]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile for real, not from a cache
    done = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT, str(spec)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ".target sm_90" in done.stdout


@pytest.mark.usefixtures("interpret")
def test_a_device_function_from_its_decomposition(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreted library's float64 form of a scalar decomposition computes it,
    rounded once (asinh, given a decomposition for the test: x >= 0, within 1 ulp)."""
    import dataclasses
    import functools

    from cuvil_ir import scalar_functions
    from cuvil_runtime.triton_kernels.devicelib import interpreted

    row = dataclasses.replace(scalar_functions.TABLE["asinh"], decomposition="log(x + sqrt(x * x + 1))")
    monkeypatch.setitem(scalar_functions.TABLE, "asinh", row)
    monkeypatch.setattr(scalar_functions, "_parsed", functools.cache(scalar_functions._parsed.__wrapped__))
    monkeypatch.setattr(interpreted, "asinh", interpreted._float64_form("asinh"))
    x = torch.tensor([0.0, 1e-3, 0.5, 1.0, 3.0, 100.0, 1e6, float("inf"), float("nan")])
    _compare(_run("cu.asinh(a0)", [x], F32), torch.asinh(x), 1, True, "asinh from its decomposition")
    y = torch.tensor([1.0, 2.0, 0.5, 4.0, 3.0, 1.0, 2.0, 1.0, 1.0])
    row = dataclasses.replace(scalar_functions.TABLE["atan2"], decomposition="x / y + 1")
    monkeypatch.setitem(scalar_functions.TABLE, "atan2", row)  # a binary one: broadcast operands
    monkeypatch.setattr(interpreted, "atan2", interpreted._float64_form("atan2"))
    got = _run("cu.atan2(a0, a1)", [x, y], F32)
    _compare(got, x / y + 1, 0, True, "x / y + 1 from its decomposition")
