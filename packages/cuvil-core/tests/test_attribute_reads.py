"""The state guard of a module whose forward runs unconverted covers the attributes its
code read while traced ([Note: recorded attribute reads] in
cuvil/frontend/attribute_reads.py): an attribute it reads is guarded by value, one it
looked for and did not find must stay absent, one it never read is not a recompile;
code reading ``__dict__`` gets the whole-dict guard."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import cuvil as cu

# Modules whose forward runs as it is, as a library's does: classes with no source file
# (exec) are not converted, like those of transformers or torch.nn.
_LIBRARY = """
class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bias_on = True

    def forward(self, x):
        y = self.lin(x) * getattr(self, "scale", 1.0)
        return y + 1 if self.bias_on else y


class Everything(Scaled):
    def forward(self, x):
        return self.lin(x) * (2.0 if "scale" in vars(self) else 1.0)
"""
_namespace: dict[str, Any] = {"nn": nn, "__name__": "cuvil_test_library"}
exec(compile(_LIBRARY, "<library>", "exec"), _namespace)  # noqa: S102 -- our own text
Scaled, Everything = _namespace["Scaled"], _namespace["Everything"]


@pytest.mark.parametrize("target", ["reference", "cpu"])
@torch.no_grad()
def test_only_what_was_read_is_guarded(target: str) -> None:
    m = Scaled().eval()
    f = cu.compile(m, target=target, fallback="error")
    x = torch.randn(2, 4)
    torch.testing.assert_close(f(x), m(x))
    m.bookkeeping = {"calls": 1}  # never read by forward (generate() keeps its cache so)
    m.counter = 3
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 1, f.stats.recompile_reasons
    m.scale = 2.0  # looked for and absent at capture: now present
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 2
    assert "'scale' added" in f.stats.recompile_reasons[-1]
    m.bias_on = False  # read: guarded by value
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 3
    assert "bias_on: True -> False" in f.stats.recompile_reasons[-1]
    # the module's class is its own again, and eager calls are not recorded
    assert type(m) is Scaled and type(m.lin) is nn.Linear


@torch.no_grad()
def test_reading_the_instance_dict_guards_all_of_it() -> None:
    m = Everything().eval()
    f = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(2, 4)
    torch.testing.assert_close(f(x), m(x))
    m.unrelated = 1
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 2, f.stats.recompile_reasons
    m.scale = 1.5
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 3, f.stats.recompile_reasons


@torch.no_grad()
def test_two_captures_of_one_module_in_two_threads_restore_its_class() -> None:
    """Swaps are counted: the class comes back when the last capture ends, and each
    capture records its own reads."""
    m = Scaled().eval()
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    compiled: list[Any] = []

    def run(shape: int) -> None:
        try:
            f = cu.compile(m, target="reference", fallback="error")
            compiled.append(f)
            start.wait()
            x = torch.randn(shape, 4)
            torch.testing.assert_close(f(x), m(x))
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert type(m) is Scaled
    for f in compiled:
        m.scale = 3.0
        x = torch.randn(2, 4)
        torch.testing.assert_close(f(x), m(x))  # both captures guarded the absent scale
        assert f.stats.compiles == 2
        del m.scale


class Converted(nn.Module):
    """A user module without hooks: its forward is converted, its reads hooked."""

    def __init__(self, read: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.read = read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.read == "getattr":
            return y * getattr(self, "scale", 1.0)
        if self.read == "hasattr":
            return y * (2.0 if hasattr(self, "scale") else 1.0)
        if self.read == "vars":
            return y * len(vars(self))
        return y * len(dir(self))


@pytest.mark.parametrize("read", ["getattr", "hasattr", "vars", "dir"])
@torch.no_grad()
def test_builtin_reads_of_a_converted_module_are_guarded(read: str, tmp_path, monkeypatch) -> None:
    """``getattr(self, name, default)``, ``hasattr``, ``vars(self)`` and ``dir(self)`` in
    converted code are reads: setting the attribute afterwards recompiles, in this process
    and through the warm-start store (which took the stored variant before: a stale
    default). A cache of its own: with the user's, a second run of the suite warm-started
    both variants (right, but not what this counts)."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    m = Converted(read).eval()
    f = cu.compile(m, target="reference", fallback="error")
    x = torch.randn(2, 4)
    torch.testing.assert_close(f(x), m(x))
    m.scale = 3.0
    torch.testing.assert_close(f(x), m(x))
    assert f.stats.compiles == 2 and f.stats.warm_starts == 0, f.stats
