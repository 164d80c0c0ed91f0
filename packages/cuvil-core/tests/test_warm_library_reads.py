"""Warm starts across processes never reuse a variant whose library reads differ (issue
26, item 5): a setting of a module under ``site-packages`` computed from the environment
(read by user code or by the library function it calls), a torch function monkeypatched
in one process only, and one of two lambdas defined on the same line. Each case runs two
real child processes against one cache folder and compares with eager; the same change
inside one process recaptures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import cuvil as cu

LIB = textwrap.dedent(
    """
    import os
    SCALE = float(os.environ.get("ENVLIB_SCALE", "2.0"))
    OFFSET = float(os.environ.get("ENVLIB_OFFSET", "0.0"))

    DEEP = float(os.environ.get("ENVLIB_DEEP", "1.0"))

    def scale(x):
        return x * SCALE

    def _deepest(x):
        return x * DEEP

    def _middle(x):
        return _deepest(x) + 1

    def deep(x):
        return _middle(x) - 1
    """
)

USER = textwrap.dedent(
    """
    import os
    import torch
    import envlib

    A, B = (lambda x: x + 1), (lambda x: x * 3)
    HELPER = A if os.environ.get("PICK", "a") == "a" else B

    def offset(x):
        return x + envlib.OFFSET

    def scaled(x):
        return envlib.scale(x) - 1

    def relu(x):
        return torch.relu(x) * 2

    def helper(x):
        return HELPER(x) * 2

    def deep(x):
        return envlib.deep(x) * 2
    """
)

CHILD = textwrap.dedent(
    """
    import json, os, sys, torch
    sys.path[:0] = sys.argv[1:3]
    if os.environ.get("PATCH_RELU"):
        torch.relu = lambda t: t * 100
    import cuvil as cu
    import userdef
    fn = getattr(userdef, os.environ["CASE"])
    x = torch.linspace(-2, 2, 7)
    c = cu.compile(fn, target="reference", fallback="error")
    got = c(x)
    print(json.dumps({"diff": float((got - fn(x)).abs().max()), "warm": c.stats.warm_starts}))
    """
)


@pytest.fixture
def dirs(tmp_path):
    lib = tmp_path / "site-packages"  # a library by cuvil's rule (convert.is_user_file)
    user = tmp_path / "user"
    lib.mkdir()
    user.mkdir()
    (lib / "envlib.py").write_text(LIB)
    (user / "userdef.py").write_text(USER)
    return tmp_path


def _child(root, case, **env):
    full = dict(os.environ, CUVIL_CACHE_DIR=str(root / "cache"), CASE=case, **env)
    for k in ("ENVLIB_SCALE", "ENVLIB_OFFSET", "ENVLIB_DEEP", "PICK", "PATCH_RELU"):
        if k not in env:
            full.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(root / "user"), str(root / "site-packages")],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "case,first,second",
    [
        ("offset", {}, {"ENVLIB_OFFSET": "5.0"}),  # user code reads the library's setting
        ("scaled", {}, {"ENVLIB_SCALE": "-3.0"}),  # the library function reads it
        ("deep", {}, {"ENVLIB_DEEP": "4.0"}),  # a library function two calls down reads it
        ("relu", {}, {"PATCH_RELU": "1"}),  # torch.relu monkeypatched in one process
        ("relu", {"PATCH_RELU": "1"}, {}),
        ("helper", {"PICK": "a"}, {"PICK": "b"}),  # two lambdas on one line
    ],
)
def test_a_differing_library_read_is_not_reused(dirs, case, first, second):
    a = _child(dirs, case, **first)
    assert a["diff"] == 0.0 and a["warm"] == 0
    b = _child(dirs, case, **second)
    assert b["diff"] == 0.0, f"{second} reused the variant of {first or 'the defaults'}"
    assert b["warm"] == 0
    again = _child(dirs, case, **second)  # the same reads are reused
    assert again["diff"] == 0.0 and again["warm"] >= 1


def test_monkeypatched_torch_function_recaptures_in_process():
    def fn(x):
        return torch.relu(x) + torch.sigmoid(x)

    c = cu.compile(fn, target="reference", fallback="error")
    x = torch.linspace(-2, 2, 5)
    torch.testing.assert_close(c(x), fn(x))
    original = torch.sigmoid
    torch.sigmoid = torch.tanh
    try:
        torch.testing.assert_close(c(x), fn(x))
        assert "torch.sigmoid" in c.stats.recompile_reasons[-1]
    finally:
        torch.sigmoid = original
    torch.testing.assert_close(c(x), fn(x))
    assert c.stats.compiles == 2


LOCK = __import__("threading").Lock()


def test_a_variant_that_cannot_be_stored_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))

    def fn(x):
        return x if LOCK.locked() else x * 2

    c = cu.compile(fn, target="reference", fallback="error")
    x = torch.ones(3)
    torch.testing.assert_close(c(x), fn(x))
    notes = [n for n in c.stats.notes if n.startswith("not stored for warm starts")]
    assert notes and "global 'LOCK'" in notes[0] and "identity" in notes[0], c.stats.notes
