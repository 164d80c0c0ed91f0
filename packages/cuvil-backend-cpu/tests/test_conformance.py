"""The program corpus on the ``cpu`` target: every program compiles and matches eager.
(In half precision and under autocast: test_conformance_half.py.)

See :mod:`cuvil.testing.conformance` for what one check asserts.
"""

from __future__ import annotations

import pytest

from cuvil.testing import Program
from cuvil.testing.conformance import check_program, conformance_params

#: program name -> why the cpu target cannot run it yet. Strict: once a program
#: passes, its entry must go.
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("program", conformance_params(XFAIL))
def test_conformance(program: Program) -> None:
    check_program(program, "cpu")
