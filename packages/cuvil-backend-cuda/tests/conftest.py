"""The cuda target's tests run without a GPU: kernels in Triton's interpreter.

``nox -s tests_cuda`` sets ``TRITON_INTERPRET=1`` for the whole session (the
target reads it when first imported); the ``interpreter`` fixture skips a test
when it is not set, so a plain ``pytest`` run on a GPU host does not mix modes.
"""

from __future__ import annotations

import pytest

from cuvil_backend_cuda.declared import INTERPRET


@pytest.fixture
def interpreter() -> None:
    if not INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 (nox -s tests_cuda sets it)")
