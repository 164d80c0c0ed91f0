"""The ascend target's tests run without an NPU: kernels in Triton's interpreter.

``nox -s tests_ascend`` sets ``CUVIL_ASCEND_SIM=1`` (and ``TRITON_INTERPRET=1``) for
the whole session; the ``simulation`` fixture skips a test when it is not set, so a
plain ``pytest`` run on an Ascend host does not mix modes. ``nox -s
tests_ascend_compile`` runs ``test_ascend_compile.py`` in an environment whose
``triton`` is triton-ascend's (the ``ascend_compiler`` fixture).
"""

from __future__ import annotations

import pytest
from cuvil_backend_ascend.declared import ASCEND_COMPILER, SIM


@pytest.fixture
def simulation() -> None:
    if not SIM:
        pytest.skip("needs CUVIL_ASCEND_SIM=1 (nox -s tests_ascend sets it)")


@pytest.fixture
def ascend_compiler() -> None:
    if not ASCEND_COMPILER:
        pytest.skip("needs triton-ascend as the installed triton (nox -s tests_ascend_compile)")
