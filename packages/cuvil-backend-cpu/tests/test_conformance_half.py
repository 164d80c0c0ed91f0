"""The program corpus on the ``cpu`` target in half precision: with its float32 tensors
(and a module's parameters) in bfloat16 and in float16, and called under
``torch.autocast("cpu", dtype=torch.bfloat16)``; every program compiles and matches eager
in the same dtype, within :data:`cuvil.testing.conformance.TOLERANCES`.

Not in ``nox -s tests_isa``: the half conversions each ISA builds are tested there by
test_half.py; the corpus runs here once, with the host's kernels.
"""

from __future__ import annotations

import pytest
import torch

from cuvil.testing import Program
from cuvil.testing.conformance import check_program, conformance_params

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
