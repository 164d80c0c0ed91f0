"""Repository-wide pytest configuration.

Command-line options are registered here, once: with ``--import-mode=importlib``
every package's ``tests/conftest.py`` is loaded too, and two conftests adding the
same option is an error. This file sits in the rootdir (next to pyproject.toml),
so pytest loads it for any test path under the repository.
"""

from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files (packages/cuvil-core/tests/golden/*.txt) instead of comparing against them",
    )
