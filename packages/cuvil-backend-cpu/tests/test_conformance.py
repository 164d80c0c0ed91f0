"""The program corpus on the ``cpu`` target: every program compiles and matches eager,
in float32 and again with its float32 tensors (and parameters) in bfloat16 and float16.

See :mod:`cuvil.testing.conformance` for what one check asserts.
"""

from __future__ import annotations

import pytest
import torch

from cuvil.testing import Program
from cuvil.testing.conformance import check_program, conformance_params

#: program name -> why the cpu target cannot run it yet. Strict: once a program
#: passes, its entry must go.
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("program", conformance_params(XFAIL))
def test_conformance(program: Program) -> None:
    check_program(program, "cpu")


#: program name -> why the cpu target cannot run it in a half type yet (strict, as XFAIL)
HALF_XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("program", conformance_params(HALF_XFAIL, dtype=torch.bfloat16))
def test_conformance_in_half(program: Program, dtype: torch.dtype) -> None:
    check_program(program, "cpu", dtype=dtype)


@pytest.mark.parametrize("program", conformance_params())
def test_conformance_under_autocast(program: Program) -> None:
    """Each program called under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the
    compiled variant has autocast's casts in its graph ([Note: autocast captured])."""
    check_program(program, "cpu", autocast=torch.bfloat16)
