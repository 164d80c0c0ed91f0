"""The program corpus on the ``ascend`` target, kernels run in Triton's interpreter.

``nox -s tests_ascend`` sets ``CUVIL_ASCEND_SIM=1``: every corpus program compiles
under Ascend's rules (every launch is checked against them) and matches eager on
CPU tensors. See :mod:`cuvil.testing.conformance` for what one check asserts.
"""

from __future__ import annotations

import pytest

from cuvil.testing import Program
from cuvil.testing.conformance import check_program, conformance_params

pytestmark = pytest.mark.usefixtures("simulation")

#: program name -> why the ascend target cannot run it yet. Strict: once a program
#: passes, its entry must go.
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("program", conformance_params(XFAIL))
def test_conformance(program: Program) -> None:
    check_program(program, "ascend")
