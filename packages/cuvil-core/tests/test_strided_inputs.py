"""Non-contiguous tensor inputs are read where they lie (issue 26, item 14a).

A compiled call used to copy every non-contiguous input to a contiguous tensor first:
an expanded ``(1, 4096) -> (65536, 4096)`` input cost 1 GiB and 1.5 s where eager
allocates nothing. On a target whose kernels can take strides (``cpu``), such a call
now runs the program lowered with per-call strides (a zero stride for an expanded
dim), made on the first call that needs it; contiguous calls keep the dense kernels.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import cuvil as cu
from cuvil_backend_cpu.testing import executable_of

TARGETS = sorted(b.name for b in cu.backends() if b.available)


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _same(got, expected) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, expected, equal_nan=True)
    else:
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)


def elementwise_and_reduce(x, y):
    return x * 2 + y, (x * y).sum(0), torch.softmax(x, -1)


def test_expanded_input_is_not_copied():
    """The call allocates no dense copy of an expanded input (measured in a process of
    its own: the peak resident memory of the call, reset just before it); the copy the
    runner used to make was the whole dense size, 32 MiB here."""
    script = textwrap.dedent(
        """
        import json, torch, cuvil as cu

        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024

        @cu.compile(target="cpu")
        def f(x, y):
            return (x * 2 + y).sum(0)

        y = torch.randn(1, 2048)
        f(torch.randn(4096, 2048), y)  # compiled for contiguous inputs first
        x = torch.randn(1, 2048).expand(4096, 2048)
        f(x, y)  # the first strided call builds its kernels
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets the peak (VmHWM) to the current resident size
        before = status("VmRSS")
        out = f(x, y)
        grew = status("VmHWM") - before
        ok = torch.allclose(out, (x * 2 + y).sum(0), rtol=1e-4, atol=1e-2)
        print(json.dumps({"grew": grew, "ok": ok}))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"]
    dense = 4096 * 2048 * 4
    assert got["grew"] < dense // 8, f"the call grew the resident memory by {got['grew']} bytes"


def test_layouts_match_eager_and_contiguous_calls_stay_dense():
    cf = cu.compile(elementwise_and_reduce, target="cpu")
    x, y = _randn(6, 10), _randn(6, 10, seed=1)
    _same(cf(x, y), elementwise_and_reduce(x, y))
    runner = executable_of(cf)._runner
    assert runner._strided is None  # contiguous calls never build the strided program
    t = _randn(10, 6).t()
    _same(cf(t, y), elementwise_and_reduce(t, y))
    assert runner._strided is None  # a transpose is copied for the dense kernels
    layouts = [
        (_randn(1, 10).expand(6, 10), y),  # a zero stride
        (_randn(1, 10).expand(6, 10), t),  # expanded and transposed
        (_randn(6, 20)[:, ::2], _randn(1, 1).expand(6, 10)),  # a step, and every stride zero
        (_randn(7, 10)[1:], _randn(10).expand(6, 10)),  # a storage offset; a new leading dim
        (x, _randn(6, 1).expand(6, 10)),  # one input contiguous, the other expanded
    ]
    for a, b in layouts:
        _same(cf(a, b), elementwise_and_reduce(a, b))
    strided = runner._strided
    assert strided is not None
    text = strided.program.text
    assert "strides(stride_in0_0, stride_in0_1)" in text
    _same(cf(x, y), elementwise_and_reduce(x, y))  # back to the dense kernels
    # other sizes (dynamic shapes) through the same strided program
    a = _randn(1, 3).expand(4, 3)
    _same(cf(a, _randn(4, 3)), elementwise_and_reduce(a, _randn(4, 3)))
    assert runner._strided is strided


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bool])
def test_dtypes(dtype):
    def f(x, y):
        return x & y if dtype == torch.bool else x * y - x

    if dtype.is_floating_point:
        x = _randn(1, 5, dtype=dtype)
    elif dtype == torch.bool:
        x = _randn(1, 5) > 0
    else:
        x = torch.randint(-9, 9, (1, 5), dtype=dtype, generator=torch.Generator().manual_seed(0))
    x = x.expand(3, 5)
    y = x.t().contiguous().t()  # the same values, transposed layout
    cf = cu.compile(f, target="cpu")
    _same(cf(x, y), f(x, y))


def test_views_externs_and_control_flow():
    """An expanded input reshaped (a copy that eager makes too), passed to an extern
    (matmul) and to a captured loop's region, stays correct."""

    def f(x, w, n: int):
        h = x.reshape(-1) * 3
        m = x @ w
        acc = x[0]
        for _ in range(n):
            acc = acc + x[1]
        return h, m, acc

    cf = cu.compile(f, target="cpu")
    x, w = _randn(4, 5), _randn(5, 3, seed=2)
    _same(cf(x, w, 3), f(x, w, 3))
    xe = _randn(1, 5, seed=3).expand(4, 5)
    _same(cf(xe, w, 3), f(xe, w, 3))
    wt = _randn(3, 5, seed=4).t()
    _same(cf(xe, wt, 2), f(xe, wt, 2))


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_agrees_with_eager(target):
    def f(x):
        return (x - x.mean(-1, keepdim=True)).abs().amax(0)

    cf = cu.compile(f, target=target)
    x = _randn(1, 9).expand(5, 9)
    _same(cf(x), f(x))
    t = _randn(9, 5, seed=1).t()
    _same(cf(t), f(t))
