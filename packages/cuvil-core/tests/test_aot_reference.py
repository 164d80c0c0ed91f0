"""Ahead-of-time artifacts of the ``reference`` target (no binaries: the graph is the
program), so the format, the call checks and ``cuvil aot inspect`` are tested without a
C compiler. The ``cpu`` target's artifacts: packages/cuvil-backend-cpu/tests/test_aot.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cuvil as cu
from cuvil.aot import inspect_artifact

LIMIT = 0.5


def clipped_softmax(x: torch.Tensor, ys: list[torch.Tensor], *, temperature: float = 1.0) -> tuple:
    z = torch.clamp(x, -LIMIT, LIMIT) / temperature
    for y in ys:
        z = z + y.mean(-1, keepdim=True)
    return torch.softmax(z, -1), z.shape[0]


@torch.no_grad()
def test_reference_round_trip(tmp_path: Path) -> None:
    f = cu.compile(clipped_softmax, target="reference", fallback="error")
    x, ys = torch.randn(2, 5), [torch.randn(2, 3), torch.randn(2, 1)]
    path = cu.save(f, tmp_path / "ref.cuvil", x, ys, temperature=2.0)
    g = cu.load(path)
    for b in (1, 2, 7):
        args = (torch.randn(b, 5), [torch.randn(b, 3), torch.randn(b, 1)])
        got, want = g(*args, temperature=2.0), clipped_softmax(*args, temperature=2.0)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == b  # a size output: an int, computed per call
    with pytest.raises(TypeError, match="structure differs"):
        g(x, ys[:1], temperature=2.0)
    with pytest.raises(TypeError, match="saved for float 2.0"):
        g(x, ys, temperature=1.0)
    info = inspect_artifact(path)
    assert info["runs_here"] and info["manifest"]["target"] == "reference"
    assert "global 'LIMIT' = 0.5" in info["call"]["frozen"]
    assert [leaf["name"] for leaf in info["call"]["leaves"]] == ["x", "ys_0", "ys_1", "temperature"]


def test_a_function_that_does_not_compile_is_not_saved(tmp_path: Path) -> None:
    def bad(x: torch.Tensor) -> torch.Tensor:
        return x if x.sum().item() > 0 else -x  # a Python bool from tensor data

    with pytest.raises(cu.CompileError):
        cu.save(cu.compile(bad, target="reference"), tmp_path / "bad.cuvil", torch.ones(2))
    assert not (tmp_path / "bad.cuvil").exists()
    assert not list(tmp_path.iterdir())  # no temporary file left either


OFFSET = torch.tensor([1.0, 2.0, 3.0])


def shifted(x: torch.Tensor, shift: torch.Tensor = OFFSET, *, scale: float = 2.0) -> torch.Tensor:
    return x * scale + shift


@torch.no_grad()
def test_defaults_left_out_when_saved_stay_optional(tmp_path: Path) -> None:
    """A parameter with a default the saved call did not pass (here a tensor, which JSON
    cannot hold) stays optional in the loaded artifact: its value is in the graph."""
    g = cu.load(cu.save(cu.compile(shifted, target="reference"), tmp_path / "d.cuvil", torch.ones(4, 3)))
    x = torch.randn(2, 3)
    torch.testing.assert_close(g(x), shifted(x))
    with pytest.raises(TypeError, match="structure differs"):
        g(x, scale=3.0)  # passing it is another call than the one saved
