"""Fused GEMM/convolution epilogues and BatchNorm folding (``cuvil_backend_cpu.epilogues``),
each checked against eager PyTorch (values and dtypes): every fused form with and without
bias, odd sizes, two batch sizes through one compile, parameters updated in place between
calls, and the cases that must not fuse (a training-mode batch norm, an intermediate with
another user, a residual that broadcasts, float64).

Every rule is switched on here, whether or not the target enables it by default (the
default is what was measured faster on the host: docs/cpu-backend.md), so each form's
code is tested.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil as cu
from cuvil.api import _EXECUTABLES
from cuvil_backend_cpu import epilogues, externs
from cuvil_backend_cpu.testing import executable_of

ONEDNN = externs._ONEDNN


@pytest.fixture(autouse=True)
def all_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # executables are cached by captured graph: one compiled under other rules must not serve
    _EXECUTABLES.clear()
    monkeypatch.setattr(epilogues, "ENABLED", frozenset(epilogues.RULES))
    yield
    _EXECUTABLES.clear()


def compiled(fn: Any) -> Any:
    return cu.compile(fn, target="cpu", fallback="error", dynamic=True)


def graph_text(f: Any) -> str:
    """The graph the target lowered (its ``graph_ir`` stage stays the captured graph)."""
    ex = executable_of(f)
    assert ex.stages["graph_ir"] == f.graphs[-1].text
    assert ex.program.graph is not None
    return ex.program.graph.text


def check(got: Any, expected: Any, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


def frozen(m: nn.Module) -> nn.Module:
    return m.eval().requires_grad_(False)


# -- linear -------------------------------------------------------------------------------------

# 67 x 129 x 131 = 1.13M multiply-adds: above externs.ONEDNN_MIN_MACS, so oneDNN runs it
ACTS = {
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_linear_activation_is_one_call(act: str, bias: bool) -> None:
    torch.manual_seed(0)
    lin = frozen(nn.Linear(129, 131, bias=bias))
    fn = ACTS[act]

    def f(x: torch.Tensor) -> torch.Tensor:
        return fn(lin(x)) * 2.0  # the activation's result feeds a generated kernel

    c = compiled(f)
    for rows in (67, 93):  # two sizes, one compile
        x = torch.randn(rows, 129)
        check(c(x), f(x))
    assert c.stats.compiles == 1
    text = graph_text(c)
    assert "cpu_linear_epilogue(" in text and f'act = "{act}"' in text and " linear(" not in text


@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual_add_is_one_call(bias: bool) -> None:
    torch.manual_seed(1)
    lin = frozen(nn.Linear(131, 131, bias=bias))

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + lin(x)  # the residual: an input whose size an assumption pins

    c = compiled(f)
    for b, t in ((1, 67), (2, 45)):
        x = torch.randn(b, t, 131)
        check(c(x), f(x))
    assert c.stats.compiles == 1
    assert "has_other = true" in graph_text(c)


def test_linear_weight_updated_in_place_is_seen() -> None:
    torch.manual_seed(2)
    lin = frozen(nn.Linear(129, 131))

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x))

    c = compiled(f)
    x = torch.randn(67, 129)
    check(c(x), f(x))
    with torch.no_grad():
        lin.weight.mul_(-1.5)
        lin.bias.add_(0.25)
    check(c(x), f(x))


def test_linear_intermediate_with_another_user_is_not_fused() -> None:
    torch.manual_seed(3)
    lin = frozen(nn.Linear(129, 131))

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = lin(x)
        return torch.relu(y), y  # the pre-activation value is a result too

    c = compiled(f)
    x = torch.randn(67, 129)
    check(c(x), f(x))
    assert "cpu_linear_epilogue" not in graph_text(c)


def test_linear_residual_that_broadcasts_is_not_fused() -> None:
    torch.manual_seed(4)
    lin = frozen(nn.Linear(129, 131))
    r = torch.randn(131)

    def f(x: torch.Tensor) -> torch.Tensor:
        return lin(x) + r

    c = compiled(f)
    x = torch.randn(67, 129)
    check(c(x), f(x))
    assert "has_other = true" not in graph_text(c)


# -- convolutions -----------------------------------------------------------------------------


def _randomize(bn: nn.BatchNorm2d) -> None:
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0.0, 0.3)
        bn.running_mean.normal_(0.0, 0.3)
        bn.running_var.uniform_(0.5, 1.5)


class Block(nn.Module):
    """conv -> BN [-> + residual] [-> relu], a ResNet basic block's pieces, odd sizes."""

    def __init__(self, bias: bool, residual: bool, relu: bool, stride: int = 1, affine: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(5, 5 if residual else 7, 3, stride, 1, bias=bias)
        self.bn = nn.BatchNorm2d(self.conv.out_channels, affine=affine)
        if affine:
            _randomize(self.bn)
        else:
            with torch.no_grad():
                self.bn.running_mean.normal_(0.0, 0.3)
                self.bn.running_var.uniform_(0.5, 1.5)
        self.residual = residual
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + x
        return F.relu(y) if self.relu else y


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_batch_norm_folded(bias: bool, residual: bool, relu: bool) -> None:
    torch.manual_seed(5)
    m = frozen(Block(bias, residual, relu))
    c = compiled(m)
    for n, hw in ((2, 11), (3, 13)):  # two batch and image sizes, one compile
        x = torch.randn(n, 5, hw, hw)
        check(c(x), m(x))
    assert c.stats.compiles == 1
    text = graph_text(c)
    assert "bn = true" in text and "batch_norm(" not in text and "conv(" not in text
    assert ("has_other = true" in text) == residual
    assert ('act = "relu"' in text) == relu


def test_empty_batch_first() -> None:
    torch.manual_seed(15)
    m = frozen(Block(bias=True, residual=True, relu=True))
    c = compiled(m)
    for n in (0, 2):  # the first call packs nothing
        x = torch.randn(n, 5, 11, 11)
        check(c(x), m(x))


def test_conv_batch_norm_without_affine_and_strided() -> None:
    torch.manual_seed(6)
    m = frozen(Block(bias=True, residual=False, relu=True, stride=2, affine=False))
    c = compiled(m)
    for n in (1, 3):
        x = torch.randn(n, 5, 12, 9)
        check(c(x), m(x))
    assert "has_bn_weight = false" in graph_text(c)


def test_conv_relu_and_residual_without_batch_norm() -> None:
    torch.manual_seed(7)
    conv = frozen(nn.Conv2d(6, 6, 3, padding=1, groups=3))

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(conv(x)), torch.relu(conv(x) + x)

    c = compiled(f)
    for n in (2, 3):
        x = torch.randn(n, 6, 9, 10)
        check(c(x), f(x))
    text = graph_text(c)
    assert text.count("cpu_conv_epilogue(") == 2 and "bn = false" in text


def test_folded_parameters_follow_in_place_updates() -> None:
    """The fold is cached per parameter version: a statistic, an affine parameter or the
    convolution's weight changed in place between calls is seen by the next call."""
    torch.manual_seed(8)
    m = frozen(Block(bias=True, residual=True, relu=True))
    c = compiled(m)
    x = torch.randn(2, 5, 11, 11)
    check(c(x), m(x))
    for update in (
        lambda: m.bn.running_var.mul_(3.0),
        lambda: m.bn.running_mean.add_(0.5),
        lambda: m.bn.weight.neg_(),
        lambda: m.bn.bias.add_(1.0),
        lambda: m.conv.weight.mul_(0.5),
        lambda: m.conv.bias.sub_(0.25),
    ):
        before = c(x)
        with torch.no_grad():
            update()
        after = c(x)
        check(after, m(x))
        assert not torch.allclose(before, after)
    assert c.stats.compiles == 1


def test_a_replaced_parameter_is_seen() -> None:
    torch.manual_seed(9)
    m = frozen(Block(bias=False, residual=False, relu=True))
    c = compiled(m)
    x = torch.randn(2, 5, 11, 11)
    check(c(x), m(x))
    m.bn.running_var = torch.rand(7) + 0.5  # a new tensor in the buffer's slot
    m.conv.weight = nn.Parameter(torch.randn(7, 5, 3, 3), requires_grad=False)
    check(c(x), m(x))


def test_training_mode_batch_norm_is_not_folded() -> None:
    """A batch norm on batch statistics (training mode; here one that keeps no running
    statistics, since compiled code does not update buffers in place) is not folded."""
    torch.manual_seed(10)
    conv = frozen(nn.Conv2d(5, 7, 3, padding=1))
    bn = nn.BatchNorm2d(7, track_running_stats=False).requires_grad_(False)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0.0, 0.3)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.relu(bn(conv(x)))

    c = compiled(f)
    for n in (2, 4):
        x = torch.randn(n, 5, 11, 11)
        check(c(x), f(x))
    assert "bn = true" not in graph_text(c) and "batch_norm(" not in graph_text(c)


def test_conv_output_with_another_user_is_not_folded() -> None:
    torch.manual_seed(11)
    m = frozen(Block(bias=True, residual=False, relu=True))

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = m.conv(x)
        return F.relu(m.bn(y)), y

    c = compiled(f)
    x = torch.randn(2, 5, 11, 11)
    check(c(x), f(x))
    assert "bn = true" not in graph_text(c) and "batch_norm(" in graph_text(c)


def test_float64_is_not_rewritten_and_falls_back() -> None:
    torch.manual_seed(12)
    m = frozen(Block(bias=True, residual=True, relu=True)).double()
    c = compiled(m)
    x = torch.randn(2, 5, 11, 11, dtype=torch.float64)
    check(c(x), m(x), rtol=1e-12, atol=1e-12)
    assert "cpu_conv_epilogue" not in graph_text(c)
    # the implementations themselves run the eager composition for what oneDNN does not take
    conv, bn = m.conv, m.bn
    attrs = dict(
        stride=(1, 1),
        padding=(1, 1),
        dilation=(1, 1),
        groups=1,
        has_bias=True,
        bn=True,
        eps=bn.eps,
        has_bn_weight=True,
        has_bn_bias=True,
        has_other=True,
        act="relu",
    )
    args = (x, conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias, x)
    got = externs.conv_epilogue(*args, **attrs)
    check(got, m(x), rtol=1e-12, atol=1e-12)
    lin = nn.Linear(129, 131).double()
    xl = torch.randn(67, 129, dtype=torch.float64)
    got = externs.linear_epilogue(xl, lin.weight, lin.bias, has_bias=True, has_other=False, act="gelu")
    check(got, F.gelu(lin(xl)).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not ONEDNN, reason="oneDNN is not available in this torch build")
def test_plain_conv_runs_with_a_prepacked_weight() -> None:
    torch.manual_seed(13)
    conv = frozen(nn.Conv2d(5, 7, 3, padding=2, dilation=2))

    def f(x: torch.Tensor) -> torch.Tensor:
        return conv(x) * 0.5

    c = compiled(f)
    for n in (1, 3):
        x = torch.randn(n, 5, 10, 11)
        check(c(x), f(x))
    with torch.no_grad():
        conv.weight.add_(1.0)
    check(c(x), f(x))


def test_rewrite_is_deterministic_and_idempotent() -> None:
    torch.manual_seed(14)
    m = frozen(Block(bias=True, residual=True, relu=True))
    c = compiled(m)
    c(torch.randn(2, 5, 11, 11))
    captured = c.artifacts[-1].captured.graph
    once = epilogues.rewrite(captured)
    assert once.text == epilogues.rewrite(captured).text == graph_text(c)
    assert epilogues.rewrite(once) is once
    assert epilogues.rewrite(captured, frozenset()) is captured
