"""The program corpus on the ``cpu`` target: every program compiles and matches eager.
(In half precision and under autocast: test_conformance_half.py.)

See :mod:`cuvil.testing.conformance` for what one check asserts. A program whose wrapper has
native runs ([Note: native runs] in cuvil_runtime.native_runs) is compiled once more with them
off, and the two executors' results must be equal, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import cuvil.api
from cuvil.testing import Program
from cuvil.testing.conformance import assert_same, compile_and_check, conformance_params
from cuvil_runtime.cache import CompileCache
from cuvil_runtime.pipeline import ProgramExecutable

#: program name -> why the cpu target cannot run it yet. Strict: once a program
#: passes, its entry must go.
XFAIL: dict[str, str] = {}


def native_runs(compiled: object) -> int:
    """How many native runs the wrappers of ``compiled``'s artifacts have."""
    return sum(
        len(a.executable._runner.runs)
        for a in compiled.artifacts  # type: ignore[attr-defined]
        if isinstance(a.executable, ProgramExecutable)
    )


@pytest.mark.parametrize("program", conformance_params(XFAIL))
def test_conformance(program: Program, monkeypatch: pytest.MonkeyPatch) -> None:
    native = compile_and_check(program, "cpu")
    if not native_runs(native):
        return
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())  # (wrappers made with runs off)
    python = compile_and_check(program, "cpu")
    assert native_runs(python) == 0
    for variant in range(program.num_variants):
        results = []
        for compiled in (native, python):
            torch.manual_seed(variant)  # (programs that draw random numbers draw the same)
            args, kwargs = program.call_args(variant)
            results.append(compiled(*args, **kwargs))
        where = f"{program.name}, variant {variant}: native runs vs Python steps"
        assert_same(results[0], results[1], rtol=0.0, atol=0.0, where=where)
