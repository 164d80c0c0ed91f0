"""The program corpus on the ``ascend`` target in half precision, in simulation (kernels
in Triton's interpreter, every launch checked against Ascend's rules in bytes): with its
float32 tensors (and a module's parameters) in bfloat16 and in float16, every program
compiles and matches eager in the same dtype within
:data:`cuvil.testing.conformance.TOLERANCES`.

:data:`cuvil.testing.conformance.HALF_SMOKE` runs in ``nox -s tests_ascend``; the rest of
the corpus is marked ``slow`` (``nox -s slow``): the interpreter runs a half program about
as slowly as a float32 one, and the corpus in float32 is this session's largest cost.
"""

from __future__ import annotations

import pytest
import torch

from cuvil.testing import Program
from cuvil.testing.conformance import HALF_SMOKE, check_program, conformance_params

pytestmark = pytest.mark.usefixtures("simulation")

#: program name -> why the ascend target cannot run it in a half type yet (strict, as XFAIL)
HALF_XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("program", conformance_params(HALF_XFAIL, dtype=torch.bfloat16, fast=HALF_SMOKE))
def test_conformance_in_half(program: Program, dtype: torch.dtype) -> None:
    check_program(program, "ascend", dtype=dtype)
