"""The program corpus on the ``example`` target: what every target runs (``cuvil.testing``)."""

import pytest

from cuvil.testing.conformance import check_program, conformance_params


@pytest.mark.parametrize("program", conformance_params())
def test_conformance(program):
    check_program(program, "example")
