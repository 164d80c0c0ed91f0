"""The import-cycle check catches cycles (so ``nox -s lint`` cannot pass silently).

Run by ``nox -s lint``: ``pytest tools/test_check_import_cycles.py``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# nox -s lint installs grimp (and runs the check itself before this test); elsewhere, skip
pytest.importorskip("grimp")

SCRIPT = Path(__file__).with_name("check_import_cycles.py")


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def check(*src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, src)], capture_output=True, text=True, check=False
    )


def test_a_cycle_through_a_function_level_import_fails(tmp_path: Path) -> None:
    src = write(
        tmp_path / "src",
        {
            "cyc_pkg/__init__.py": "",
            "cyc_pkg/low.py": """\
                def helper():
                    from cyc_pkg.high import thing  # lazy: still a cycle

                    return thing
            """,
            "cyc_pkg/high.py": "from cyc_pkg.low import helper\n\nthing = 1\n",
            "cyc_pkg/leaf.py": "from cyc_pkg.low import helper\n",
        },
    )
    result = check(src)
    assert result.returncode == 1, result
    assert "cyc_pkg.high -> cyc_pkg.low -> cyc_pkg.high" in result.stdout
    assert "cyc_pkg/low.py:2: from cyc_pkg.high import thing" in result.stdout
    assert "cyc_pkg/high.py:1: from cyc_pkg.low import helper" in result.stdout
    assert "leaf" not in result.stdout  # it imports into the cycle, it is not on it


def test_a_longer_cycle_across_packages_fails(tmp_path: Path) -> None:
    one = write(tmp_path / "one", {"cyc_one/__init__.py": "", "cyc_one/a.py": "import cyc_two.b\n"})
    two = write(
        tmp_path / "two",
        {
            "cyc_two/__init__.py": "",
            "cyc_two/b.py": "from cyc_two import c\n",
            "cyc_two/c.py": "from cyc_one.a import x\n",
        },
    )
    result = check(one, two)
    assert result.returncode == 1, result
    assert "cyc_one.a -> cyc_two.b -> cyc_two.c -> cyc_one.a" in result.stdout


def test_a_cycle_through_a_type_checking_import_fails(tmp_path: Path) -> None:
    src = write(
        tmp_path / "src",
        {
            "cyc_pkg/__init__.py": "",
            "cyc_pkg/low.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:  # annotations only: still a cycle
                    from cyc_pkg.high import Thing


                def helper(t: Thing) -> None: ...
            """,
            "cyc_pkg/high.py": "from cyc_pkg.low import helper\n\n\nclass Thing: ...\n",
        },
    )
    result = check(src)
    assert result.returncode == 1, result
    assert "cyc_pkg.high -> cyc_pkg.low -> cyc_pkg.high" in result.stdout
    assert "cyc_pkg/low.py:4: from cyc_pkg.high import Thing" in result.stdout


def test_one_way_imports_pass(tmp_path: Path) -> None:
    src = write(
        tmp_path / "src",
        {
            "acyc_pkg/__init__.py": "from acyc_pkg.high import thing\n",
            "acyc_pkg/low.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:  # annotations only, and downward: no cycle
                    from acyc_pkg.view import View


                def helper(t: View) -> None:
                    import acyc_pkg.low as me  # a module naming itself is no cycle
            """,
            "acyc_pkg/view.py": "from typing import Protocol\n\n\nclass View(Protocol): ...\n",
            "acyc_pkg/high.py": "from acyc_pkg.low import helper\n\nthing = 1\n",
        },
    )
    result = check(src)
    assert result.returncode == 0, result
    assert "no import cycles among 4 modules" in result.stdout


def test_a_folder_that_is_not_a_source_folder_is_refused(tmp_path: Path) -> None:
    # the repository's root: its packages (benchmarks/) are not the code the check is for
    root = write(
        tmp_path / "repo",
        {"pyproject.toml": "", "benchmarks/__init__.py": "", "packages/a/src/pa/__init__.py": ""},
    )
    result = check(root)
    assert result.returncode == 2, result
    assert "a project folder, not a source folder" in result.stderr and "packages/*/src" in result.stderr
    empty = write(tmp_path / "empty", {"notes.txt": ""})
    result = check(empty)
    assert result.returncode == 2 and "holds no package" in result.stderr
    assert check(root / "packages" / "a" / "src").returncode == 0


def test_the_default_covers_the_packages_and_the_examples() -> None:
    result = check()
    assert result.returncode == 0, result
    for name in ("cuvil_ir", "cuvil_runtime", "cuvil_backend_example", "cuvil_ops_example"):
        assert name in result.stdout, result.stdout
