"""The conformance kit itself (:mod:`cuvil.testing.conformance`), on the built-in
``reference`` target.

Every corpus program passes :func:`check_program` on ``reference`` (the whole
corpus takes about 5 s here, so no subset), and the harness catches what it is
meant to catch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cuvil.testing import PROGRAMS, Program, get_program
from cuvil.testing.conformance import EAGER_REFUSES, assert_same, check_program, conformance_params


@pytest.mark.parametrize("program", conformance_params())
def test_reference_conforms(program: Program) -> None:
    stats = check_program(program, "reference")
    assert stats.fallbacks == 0 and 1 <= stats.compiles <= program.num_variants


def test_params_are_the_corpus_with_strict_xfails() -> None:
    name = PROGRAMS[0].name
    params = conformance_params({name: "a known bug"}, raises=ValueError)
    assert [p.id for p in params] == [p.name for p in PROGRAMS]
    assert [p.values[0] for p in params] == PROGRAMS
    (mark,) = params[0].marks
    assert mark.name == "xfail"
    assert mark.kwargs == {"reason": "a known bug", "strict": True, "raises": ValueError}
    assert all(not p.marks for p in params[1:])
    with pytest.raises(ValueError, match="not in the corpus"):
        conformance_params({"no_such_program": "typo"})


def test_assert_same_catches_differences() -> None:
    x = torch.arange(4.0)
    assert_same((x, 3), (x.clone(), 3), rtol=None, atol=None, where="w")
    assert_same(x + 1e-3, x, rtol=0.0, atol=1e-2, where="w")
    cases = [
        ((x,), [x], "structure"),
        (x.double(), x, "dtype"),
        (x + 1, x, "w, output leaf 0"),
        (3, x, "not a tensor"),
        ((x, 3), (x, 4), "is 3, eager 4"),
    ]
    for actual, expected, message in cases:
        with pytest.raises(AssertionError, match=message):
            assert_same(actual, expected, rtol=None, atol=None, where="w")


def test_check_program_refuses_target_and_fallback_overrides() -> None:
    with pytest.raises(ValueError, match="fallback"):
        check_program(PROGRAMS[0], "reference", compile_kwargs={"fallback": "eager"})


def test_check_program_passes_compile_kwargs() -> None:
    # dynamic=False specializes every size: one compile per shape variant, still conforming
    p = get_program("helper_chain")
    stats = check_program(p, "reference", compile_kwargs={"dynamic": False})
    assert stats.compiles == p.num_variants


def test_check_program_names_an_unknown_target() -> None:
    with pytest.raises(LookupError, match="no_such_target"):
        check_program(PROGRAMS[0], "no_such_target")


def test_importing_the_kit_does_not_import_pytest() -> None:
    # pytest is no dependency of cuvil: only conformance_params imports it (docs/testing.md)
    code = "import sys, cuvil.testing.conformance; assert 'pytest' not in sys.modules, 'pytest imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_half_runs_convert_inputs_and_modules() -> None:
    """``dtype=`` runs a program in a half type: float32 inputs and a module's parameters
    are converted for eager and compiled alike (the compiled graph's inputs are bf16), and
    the tolerance is the type's or the program's, the looser."""
    from cuvil.testing.conformance import TOLERANCES, compile_and_check, tolerance

    module = next(p for p in PROGRAMS if p.is_module and p.name not in EAGER_REFUSES)
    compiled = compile_and_check(module, "reference", dtype=torch.bfloat16)
    dtypes = {v.type.dtype.value for v in compiled.graphs[0].inputs if hasattr(v.type, "dtype")}
    assert "bf16" in dtypes and "f32" not in dtypes, dtypes
    loose = Program("loose", PROGRAMS[0].fn, PROGRAMS[0].make_inputs, atol=0.5, rtol=0.5)
    assert tolerance(loose, torch.float16) == {"atol": 0.5, "rtol": 0.5}
    assert tolerance(PROGRAMS[0], torch.float16) == TOLERANCES[torch.float16]
    assert tolerance(PROGRAMS[0], None) == PROGRAMS[0].tolerance
    params = conformance_params(dtype=torch.float16)
    skipped = {p.id for p in params if any(m.name == "skip" for m in p.marks)}
    assert skipped == set(EAGER_REFUSES)


@pytest.mark.parametrize("program", conformance_params())
def test_reference_conforms_under_autocast(program: Program) -> None:
    check_program(program, "reference", autocast=torch.bfloat16)


def test_fast_marks_every_other_program_slow() -> None:
    """``fast=`` keeps the named programs in the fast sessions and marks the rest slow;
    a name outside the corpus is an error, as in ``xfail``."""
    from cuvil.testing.conformance import HALF_SMOKE

    params = conformance_params(fast=HALF_SMOKE)
    slow = {p.id for p in params if any(m.name == "slow" for m in p.marks)}
    assert {p.id for p in params} - slow == set(HALF_SMOKE)
    with pytest.raises(ValueError, match="fast names programs that are not in the corpus"):
        conformance_params(fast=("no_such_program",))
