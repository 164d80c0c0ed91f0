"""Repository-wide pytest configuration.

Command-line options are registered here, once: with ``--import-mode=importlib``
every package's ``tests/conftest.py`` is loaded too, and two conftests adding the
same option is an error. This file sits in the rootdir (next to pyproject.toml),
so pytest loads it for any test path under the repository.
"""

from __future__ import annotations

import os

# every pipeline verifies its IR after each pass in the test suites (cuvil_ir/passes.py):
# a pass that breaks its level's invariants fails here, naming the pass
os.environ.setdefault("CUVIL_VERIFY_PASSES", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files (packages/cuvil-core/tests/golden/*.txt) instead of comparing against them",
    )
