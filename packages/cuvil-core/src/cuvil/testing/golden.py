"""Golden files: generated text compared with a reviewed copy kept beside the tests.

``check_golden(path, text, update=..., update_cmd=...)`` rewrites ``path`` when
``update`` (pytest's ``--update-golden``, registered in the repository's root
``conftest.py``), else asserts ``text`` equals it, naming the command that
regenerates it. pytest is imported only when a file is missing.
"""

from __future__ import annotations

from pathlib import Path


def check_golden(path: Path, text: str, *, update: bool, update_cmd: str) -> None:
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return
    if not path.exists():
        import pytest

        pytest.fail(f"no golden file {path.name}: run `{update_cmd}` to create it")
    assert text == path.read_text(), (
        f"the generated text differs from {path.name} (if the change is intended, run `{update_cmd}` "
        "and review the diff)"
    )


__all__ = ["check_golden"]
