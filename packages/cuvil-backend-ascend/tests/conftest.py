"""The ascend target's tests run without an NPU: kernels in Triton's interpreter.

``nox -s tests_ascend`` sets ``CUVIL_ASCEND_SIM=1`` (and ``TRITON_INTERPRET=1``) for
the whole session; the ``simulation`` fixture skips a test when it is not set, so a
plain ``pytest`` run on an Ascend host does not mix modes. ``nox -s
tests_ascend_compile`` runs ``test_ascend_compile.py`` in an environment whose
``triton`` is triton-ascend's (the ``ascend_compiler`` fixture).
"""

from __future__ import annotations

import pytest
import torch

from cuvil_backend_ascend.declared import ASCEND_COMPILER, SIM


@pytest.fixture
def simulation() -> None:
    if not SIM:
        pytest.skip("needs CUVIL_ASCEND_SIM=1 (nox -s tests_ascend sets it)")


@pytest.fixture
def ascend_compiler() -> None:
    if not ASCEND_COMPILER:
        pytest.skip("needs triton-ascend as the installed triton (nox -s tests_ascend_compile)")


class YoloxHead(torch.nn.Module):
    """A YOLOX-style decoupled head on one feature level: a stem conv, class and box
    branches, sigmoid scores and box decoding on the grid (the mission's example)."""

    def __init__(self, c: int = 16, classes: int = 5, stride: int = 8) -> None:
        super().__init__()
        self.stride = stride
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(c, c, 1), torch.nn.SiLU())
        self.cls = torch.nn.Sequential(
            torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(c, classes, 1)
        )
        self.reg = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.SiLU())
        self.box = torch.nn.Conv2d(c, 4, 1)
        self.obj = torch.nn.Conv2d(c, 1, 1)

    def forward(self, x):
        b, _, h, w = x.shape
        x = self.stem(x)
        r = self.reg(x)
        out = torch.cat([self.box(r), self.obj(r).sigmoid(), self.cls(x).sigmoid()], 1)
        out = out.flatten(2).permute(0, 2, 1)  # [b, h*w, 4 + 1 + classes]
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        grid = torch.stack((xs, ys), -1).reshape(1, h * w, 2).to(x.dtype)
        xy = (out[..., :2] + grid) * self.stride
        wh = torch.exp(out[..., 2:4]) * self.stride
        return torch.cat([xy, wh, out[..., 4:]], -1)


@pytest.fixture
def yolox_head() -> torch.nn.Module:
    torch.manual_seed(0)
    return YoloxHead().eval()
