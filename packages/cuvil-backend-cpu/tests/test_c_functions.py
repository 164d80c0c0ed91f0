"""The C renderer's function table (cuvil_backend_cpu/c_functions.py) covers every
Tensor IR scalar function, and each form it writes compiles with the real C compiler.

Values are checked against torch for every function and dtype by the Triton
library's test (packages/cuvil-backend-cuda/tests/test_triton_functions.py), which
runs the same cases through these C forms. A function without a C form is written
as its decomposition (cuvil_ir.scalar_functions)."""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess

import pytest

from cuvil_backend_cpu.c_functions import C_FORMS, C_TYPES, CodegenError, c_call
from cuvil_backend_cpu.codegen import PRELUDE, _Gen
from cuvil_ir import scalar_functions
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


def missing_c_forms() -> list[str]:
    """Scalar functions with neither a C form nor a decomposition the C renderer writes."""
    return [fn for fn in E.FUNCTIONS if fn not in C_FORMS and not scalar_functions.decomposed(fn)]


def test_every_scalar_function_has_a_c_form_or_a_decomposition():
    assert set(C_FORMS) <= set(E.FUNCTIONS)
    assert not missing_c_forms()


def _with_decomposition(monkeypatch, fn: str, text: str) -> None:
    monkeypatch.setitem(
        scalar_functions.TABLE, fn, dataclasses.replace(scalar_functions.TABLE[fn], decomposition=text)
    )
    scalar_functions._parsed.cache_clear()
    monkeypatch.setattr(scalar_functions, "_parsed", functools.cache(scalar_functions._parsed.__wrapped__))


def test_a_function_without_a_c_form_is_written_as_its_decomposition(monkeypatch, tmp_path):
    """Without its entry, asinh is reported; with a decomposition it is that decomposition's
    C (which computes asinh for x >= 0: checked by running it)."""
    monkeypatch.delitem(C_FORMS, "asinh")
    assert missing_c_forms() == ["asinh"]
    gen = _Gen(None, simd_math=False, parallel_threshold=0)  # type: ignore[arg-type]
    with pytest.raises(CodegenError, match="no C form for asinh"):
        c_call(gen, "asinh", ["a0"], DType.f64, DType.f64)
    _with_decomposition(monkeypatch, "asinh", "log(x + sqrt(x * x + 1))")
    assert missing_c_forms() == []
    text = c_call(gen, "asinh", ["a0"], DType.f64, DType.f64)
    assert "log(" in text and "sqrt(" in text and "1.0" in text, text
    src = tmp_path / "asinh.c"
    src.write_text(
        f'{PRELUDE}\n#include <stdio.h>\nint main(void) {{ double a0 = 0.75; printf("%.17g", {text}); return 0; }}\n'
    )
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "a"), str(src), "-lm"], check=True)
    out = subprocess.run([str(tmp_path / "a")], capture_output=True, text=True, check=True).stdout
    assert abs(float(out) - math.asinh(0.75)) < 1e-15


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
