"""The C renderer's function table (cuvil_backend_cpu/c_functions.py) covers every
Tensor IR scalar function, and each form it writes compiles with the real C compiler.

Values are checked against torch for every function and dtype by the Triton
library's test (packages/cuvil-backend-cuda/tests/test_triton_functions.py), which
runs the same cases through these C forms."""

from __future__ import annotations

import subprocess

import pytest

from cuvil_backend_cpu.c_functions import C_FORMS, C_TYPES, CodegenError, c_call
from cuvil_backend_cpu.codegen import PRELUDE, _Gen
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E

#: the dtypes each function is rendered for here: (argument dtypes, result dtype)
F, INT, B = DType.f32, DType.i64, DType.bool
_CMP = {"eq", "ne", "lt", "le", "gt", "ge"}
_LOGICAL = {"and", "or", "xor", "not"}
_INT_ONLY = {"bitand", "bitor", "bitxor", "bitnot"}
#: forms that do not exist, each with its reason (what lowering emits instead)
_NONE = {("floordiv", d): "float a // b is decomposed (rules.float_floordiv)" for d in (F, DType.f64)}


def _signatures(fn: str) -> list[tuple[tuple[DType, ...], DType]]:
    n = E.FUNCTIONS[fn]
    if fn == "where":
        return [((B, F, F), F), ((B, INT, INT), INT)]
    if fn == "rand":
        return [((INT, INT), F)]
    if fn == "cast":
        return [((F,), INT), ((INT,), F), ((F,), B)]
    if fn in _CMP:
        return [((F, F), B), ((INT, INT), B)]
    if fn in _LOGICAL:
        return [((B,) * n, B)]
    if fn in _INT_ONLY:
        return [((INT,) * n, INT)]
    return [((F,) * n, F), ((DType.f64,) * n, DType.f64), ((INT,) * n, INT)]


def test_the_table_is_exactly_the_scalar_functions():
    assert set(C_FORMS) == set(E.FUNCTIONS)


def test_an_unknown_function_is_a_codegen_error():
    gen = _Gen(None, simd_math=False, parallel_threshold=0)  # type: ignore[arg-type]
    with pytest.raises(CodegenError, match="no C form for frobnicate"):
        c_call(gen, "frobnicate", ["a0"], F, F)


def test_every_form_compiles(tmp_path):
    gen = _Gen(None, simd_math=False, parallel_threshold=0)  # type: ignore[arg-type]
    parts, rendered, refused = [PRELUDE], 0, []
    for fn in sorted(E.FUNCTIONS):
        for args, out in _signatures(fn):
            call = E.Call(fn, tuple(E.Var(f"a{i}", d) for i, d in enumerate(args)), out)
            try:
                text = gen.call(call)
            except CodegenError as e:
                refused.append((fn, args[0], str(e)))
                continue
            params = ", ".join(f"{C_TYPES[d]} a{i}" for i, d in enumerate(args))
            parts.append(
                f"{C_TYPES[out]} f{rendered}({params}) {{ int cu_err = 0; (void)cu_err; return {text}; }}"
            )
            rendered += 1
    # integers have no transcendental forms; everything else renders
    for fn, dtype, why in refused:
        assert (fn, dtype) in _NONE or dtype == INT, (fn, dtype, why)
    assert rendered > 100
    src = tmp_path / "forms.c"
    src.write_text("\n".join(parts) + "\n")
    r = subprocess.run(
        [
            "gcc",
            "-c",
            "-O1",
            "-Wall",
            "-Werror=implicit-function-declaration",
            "-o",
            str(tmp_path / "f.o"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
