"""Op plugins while running: ``cu.reload_plugins()`` picks up a distribution installed
after ``import cuvil``; a plugin that fails to import, or declares an op another
distribution already declared, is reported by ``cuvil ops`` and breaks nothing else.

The distributions are real: built by hatchling and installed by pip (into a folder
of their own, in a subprocess) while the process that uses them is running.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "0.1.0"

[project.entry-points."cuvil.ops"]
{entry} = "{module}"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""


def make_distribution(root: Path, dist: str, module: str, body: str) -> Path:
    folder = root / dist
    (folder / module).mkdir(parents=True)
    entry = module.removeprefix("cuvil_")
    (folder / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, entry=entry, module=module))
    (folder / module / "__init__.py").write_text(textwrap.dedent(body))
    return folder


def pip_install(folder: Path, site: Path) -> str:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    return f"subprocess.run({[*cmd, '--target', str(site), str(folder)]!r}, check=True)"


TRIPLE = """
    import torch, cuvil as cu

    @cu.custom_op("hot::triple")
    def triple(x):
        return x * 3
"""


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_distribution_installed_after_import_is_usable_after_reload(tmp_path):
    site = tmp_path / "site"
    folder = make_distribution(tmp_path, "cuvil-ops-hot", "cuvil_hot_ops", TRIPLE)
    out = run(
        f"""
        import subprocess, sys, torch
        import cuvil as cu
        from cuvil_ir import REGISTRY
        print("before", "hot::triple" in REGISTRY.names())
        {pip_install(folder, site)}
        sys.path.append({str(site)!r})  # where the new distribution went
        found = cu.reload_plugins()
        print("after", "hot::triple" in found["ops"], found["errors"])

        def f(x):
            return torch.ops.hot.triple(x) + 1

        cf = cu.compile(f, target="reference", fallback="error")
        print(cf(torch.ones(2)).tolist(), "hot::triple(" in cf.graphs[0].text)
        """
    )
    assert out.split("\n")[:3] == ["before False", "after True []", "[4.0, 4.0] True"], out


def test_failing_and_clashing_plugins_are_reported_and_break_nothing(tmp_path):
    site = tmp_path / "site"
    good = make_distribution(tmp_path, "cuvil-ops-good", "cuvil_good_ops", TRIPLE)
    clash = make_distribution(tmp_path, "cuvil-ops-clash", "cuvil_clash_ops", TRIPLE)
    broken = make_distribution(
        tmp_path, "cuvil-ops-broken", "cuvil_broken_ops", "raise ImportError('no libfoo here')\n"
    )
    out = run(
        f"""
        import subprocess, sys, torch
        {pip_install(good, site)}
        {pip_install(clash, site)}
        {pip_install(broken, site)}
        sys.path.append({str(site)!r})
        import cuvil as cu
        from cuvil.cli import main
        code = main(["ops"])
        print("exit", code)
        cf = cu.compile(lambda x: torch.ops.hot.triple(x), target="reference", fallback="error")
        print(cf(torch.ones(1)).tolist())
        """
    )
    assert "hot::triple" in out and "custom" in out, out
    assert (
        "plugin 'broken_ops' of distribution 'cuvil-ops-broken' failed to load: ImportError: no libfoo here"
        in out
    )
    # the second declaration of hot::triple names both distributions
    clash_line = next(line for line in out.splitlines() if "declared twice" in line)
    assert "cuvil-ops-good" in clash_line and "cuvil-ops-clash" in clash_line, clash_line
    assert "exit 1" in out and "[3.0]" in out, out


def test_a_plugin_that_failed_is_tried_again_by_reload(tmp_path):
    """A plugin that failed for want of something (here: a module it imports) loads
    once that is installed and ``cu.reload_plugins()`` runs."""
    site = tmp_path / "site"
    needy = make_distribution(
        tmp_path, "cuvil-ops-needy", "cuvil_needy_ops", "import cuvil_needy_dep\n" + textwrap.dedent(TRIPLE)
    )
    out = run(
        f"""
        import subprocess, sys, torch
        {pip_install(needy, site)}
        sys.path.append({str(site)!r})
        import cuvil as cu
        print(cu.reload_plugins()["errors"])
        (site := __import__("pathlib").Path({str(site)!r}) / "cuvil_needy_dep.py").write_text("")
        found = cu.reload_plugins()
        print(found["errors"], "hot::triple" in found["ops"])
        """
    )
    first, second = out.splitlines()[:2]
    assert "needy_ops (cuvil-ops-needy): ModuleNotFoundError" in first, out
    assert second == "[] True", out
