"""The cache of captured variants (cuvil/warm.py): a second process skips capture, and
anything the variant read that differs in that process -- an edited source file, a
global computed from the environment, a module attribute -- makes it capture again.
Each case runs real child processes against one cache folder and compares with eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SOURCE = textwrap.dedent(
    """
    import os
    import torch

    SCALE = float(os.environ.get("WARM_SCALE", "2.0"))
    BIAS = torch.arange(6.0)
    TABLE = {"mode": os.environ.get("WARM_MODE", "tanh"), "sizes": (1, 2)}

    def helper(x):
        return torch.tanh(x) if TABLE["mode"] == "tanh" else torch.sigmoid(x)

    def fn(x, flag: bool = True):
        if x.sum() > 0:  # a region: control flow on a tensor
            y = helper(x) * SCALE + BIAS
        else:
            y = x - BIAS
        return y * 2 if flag else y

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l = torch.nn.Linear(6, 6)
            self.k = int(os.environ.get("WARM_K", "3"))

        def forward(self, x):
            return helper(self.l(x)) * self.k

    class Box:
        def __init__(self):
            self.w = 5.0

    def with_object(x, box):
        return x * box.w
    """
)

CHILD = textwrap.dedent(
    """
    import json, sys, torch
    import cuvil as cu
    sys.path.insert(0, sys.argv[1])
    import warmdef
    out = {}
    with torch.no_grad():
        x = torch.randn(3, 6).abs() + 0.1
        f = cu.compile(warmdef.fn, target="reference", fallback="error")
        m = warmdef.Net().eval()
        g = cu.compile(m, target="reference", fallback="error")
        h = cu.compile(warmdef.with_object, target="reference", fallback="error")
        for name, c, args, want in [
            ("fn", f, (x,), warmdef.fn(x)),
            ("fn_neg", f, (-x,), warmdef.fn(-x)),
            ("fn_flag", f, (x, False), warmdef.fn(x, False)),
            ("net", g, (x,), m(x)),
            ("obj", h, (x, warmdef.Box()), x * 5.0),
        ]:
            torch.testing.assert_close(c(*args), want)
        out = {n: c.stats.warm_starts for n, c in [("fn", f), ("net", g), ("obj", h)]}
        out["dynamo"] = "torch._dynamo" in sys.modules
    print(json.dumps(out))
    """
)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "warmdef.py").write_text(SOURCE)
    return tmp_path


def _run(project: Path, **env: str) -> dict[str, int]:
    full = dict(os.environ, CUVIL_CACHE_DIR=str(project / "cache"), **env)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(project)], env=full, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_second_process_skips_capture_and_any_change_recaptures(project: Path) -> None:
    cold = _run(project)
    assert cold == {"fn": 0, "net": 0, "obj": 0, "dynamo": True}
    warm = _run(project)
    # fn: its 2 variants (one serves x and -x: the branch is a region; flag=False is
    # another) come from the cache; a call with an object argument is never stored
    assert warm["fn"] == 2 and warm["net"] == 1 and warm["obj"] == 0
    # a global computed from the environment, a dict read by a helper, a module attribute:
    # each differs in the new process, so its variants are captured again, and match eager
    changed = _run(project, WARM_SCALE="5.0", WARM_MODE="sigmoid", WARM_K="7")
    assert changed["fn"] == 0 and changed["net"] == 0
    assert _run(project, WARM_SCALE="5.0", WARM_MODE="sigmoid", WARM_K="7")["fn"] == 2


def test_an_edited_source_file_recaptures(project: Path) -> None:
    _run(project)
    src = project / "warmdef.py"
    src.write_text(src.read_text().replace("torch.tanh(x) if", "torch.tanh(x) * 0.5 if"))
    assert _run(project)["fn"] == 0  # eager is the edited code: checked in the child
    assert _run(project)["fn"] == 2


def test_a_damaged_entry_is_a_miss(project: Path) -> None:
    _run(project)
    for f in (project / "cache" / "calls").rglob("*"):
        if f.is_file() and not f.name.startswith("."):
            f.write_bytes(f.read_bytes()[:-3])
    assert _run(project)["fn"] == 0


def test_off_switch(project: Path) -> None:
    _run(project)
    assert _run(project, CUVIL_WARM="0")["fn"] == 0


def test_two_lambdas_on_one_line_are_two_variants(tmp_path: Path) -> None:
    """Same file, same line, same qualified name (``<lambda>``): the key has the code's
    fingerprint, so the second process never serves one lambda's graph for the other."""
    script = tmp_path / "lambdas.py"
    script.write_text(
        "import sys, torch, cuvil as cu\n"
        "x = torch.ones(3)\n"
        "a, b = cu.compile(lambda x: x + 1, target='reference', fallback='error'), cu.compile(lambda x: x * 5, target='reference', fallback='error')\n"
        "torch.testing.assert_close(a(x), x + 1); torch.testing.assert_close(b(x), x * 5)\n"
        "print(a.stats.warm_starts + b.stats.warm_starts)\n"
    )
    env = dict(os.environ, CUVIL_CACHE_DIR=str(tmp_path / "cache"))
    runs = [
        subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    assert [r.stdout.split()[-1] for r in runs] == ["0", "2"]


def test_an_object_with_native_behaviour_is_not_matched_by_class(tmp_path: Path) -> None:
    """``len(CFG)`` runs ``Cfg.__len__`` natively: the state it reads is guarded by no read
    guard, so a variant that read ``CFG`` is kept in its process; a second process with
    another ``CFG`` captures again and matches eager."""
    (tmp_path / "cfgdef.py").write_text(
        textwrap.dedent(
            """
            import os, torch

            class Cfg:
                def __init__(self):
                    self._n = int(os.environ.get("CFG_N", "2"))

                def __len__(self):
                    return self._n

            CFG = Cfg()

            def f(x):
                for _ in range(len(CFG)):
                    x = x * 2
                return x
            """
        )
    )
    script = (
        "import sys, torch, cuvil as cu; sys.path.insert(0, sys.argv[1]); import cfgdef;"
        "g = cu.compile(cfgdef.f, target='reference', fallback='error'); x = torch.ones(2);"
        "torch.testing.assert_close(g(x), cfgdef.f(x)); print(g.stats.warm_starts)"
    )
    outs = []
    for n in ("2", "3"):
        env = dict(os.environ, CUVIL_CACHE_DIR=str(tmp_path / "cache"), CFG_N=n)
        r = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout.split()[-1])
    assert outs == ["0", "0"]


def test_a_helper_is_matched_with_its_defaults(tmp_path: Path) -> None:
    """A global helper is matched in another process by module, name and code location,
    and by its defaults: a default computed at import (from the environment) that differs
    there makes the variant captured again."""
    (tmp_path / "helperdef.py").write_text(
        textwrap.dedent(
            """
            import os, torch

            def helper(x, k=float(os.environ.get("HELPER_K", "2"))):
                return x * k

            def f(x):
                return helper(x) + 1
            """
        )
    )
    script = (
        "import sys, torch, cuvil as cu; sys.path.insert(0, sys.argv[1]); import helperdef;"
        "g = cu.compile(helperdef.f, target='reference', fallback='error'); x = torch.ones(2);"
        "torch.testing.assert_close(g(x), helperdef.f(x)); print(g.stats.warm_starts)"
    )
    outs = []
    for k in ("2", "2", "5"):
        env = dict(os.environ, CUVIL_CACHE_DIR=str(tmp_path / "cache"), HELPER_K=k)
        r = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout.split()[-1])
    assert outs == ["0", "1", "0"]
