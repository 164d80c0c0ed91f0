"""Row kernels (softmax, log_softmax, layer_norm): one outer iteration per row with its
max/sum phases and the store, the next row prefetched, and float max reductions that
keep torch's NaN semantics. Every case is checked against eager (values and dtypes):
odd row lengths, rows of -inf (NaN, as eager), NaN and +inf, non-contiguous inputs,
``dim != -1``, float32 and float64, two sizes through one compile; and the whole set
again with kernels built for ``CUVIL_CPU_ISA=avx2`` and ``portable``: ``nox -s tests_isa``
runs this file under each, and the slow test at the end does it in child processes (the
ISA is fixed when a process first builds a kernel).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil_backend_cpu.loop_ir.nodes import Loop, Prefetch
from cuvil_backend_cpu.loop_ir.schedule import SchedulePolicy, schedule_program
from cuvil_backend_cpu.policy import FUSION
from cuvil_ir.tensor_ir.lower import lower


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def log_softmax_last(x):
    return torch.log_softmax(x, dim=-1)


def softmax_dim0(x):
    return torch.softmax(x, dim=0)


def softmax_dim1(x):
    return torch.softmax(x, dim=1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def compiled(fn: Any) -> Any:
    return cu.compile(fn, target="cpu", fallback="error")


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape)
    torch.testing.assert_close(got, want, equal_nan=True)
    # the exact places of NaN, inf and zero: a masked row stays NaN, a masked column exactly 0
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got == 0, want == 0)


def _specials(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a row of -inf, a row with some -inf, a row with a NaN and a row with +inf."""
    x = x.clone()
    rows, cols = x.shape
    if rows >= 4:
        x[0] = float("-inf")
        x[1, : (cols + 1) // 2] = float("-inf")
        x[2, cols // 2] = float("nan")
        x[3, cols - 1] = float("inf")
    return x


LENGTHS = (1, 7, 1000, 1031)


def run_softmax_cases(fn: Any, dtype: torch.dtype) -> None:
    """One compile of ``fn``, called at every row length and two row counts (one of them
    large enough for the parallel path), plain, with special values and transposed."""
    cf = compiled(fn)
    g = torch.Generator().manual_seed(0)
    for cols in LENGTHS:
        for rows in (5, 64):
            x = (torch.randn(rows, cols, generator=g) * 4).to(dtype)
            assert_same(cf(x), fn(x))
            xs = _specials(x)
            assert_same(cf(xs), fn(xs))
    # non-contiguous: a transposed view and a strided slice
    x = torch.randn(1031, 9, generator=g).to(dtype)
    assert_same(cf(x.t()), fn(x.t()))
    y = torch.randn(6, 2 * 1031, generator=g).to(dtype)
    assert_same(cf(y[:, ::2]), fn(y[:, ::2]))
    assert cf.stats.fallbacks == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fn", [softmax_last, log_softmax_last], ids=["softmax", "log_softmax"])
def test_softmax_rows_match_eager(fn, dtype):
    run_softmax_cases(fn, dtype)


def test_two_sizes_one_compile():
    cf = compiled(softmax_last)
    for rows, cols in ((33, 1000), (70, 1031)):
        x = torch.randn(rows, cols)
        assert_same(cf(x), softmax_last(x))
    assert cf.stats.compiles == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_softmax_other_dims(dtype):
    g = torch.Generator().manual_seed(1)
    x = _specials(torch.randn(1031, 7, generator=g).to(dtype)).t().contiguous().t()
    cf = compiled(softmax_dim0)
    assert_same(cf(x), softmax_dim0(x))
    x3 = torch.randn(3, 1000, 5, generator=g).to(dtype)
    x3[1, :, 2] = float("-inf")
    cf3 = compiled(softmax_dim1)
    assert_same(cf3(x3), softmax_dim1(x3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_layer_norm_rows(dtype):
    g = torch.Generator().manual_seed(2)
    cf = compiled(layer_norm)
    for cols in LENGTHS:
        for rows in (5, 64):
            x = (torch.randn(rows, cols, generator=g) * 3 + 1).to(dtype)
            w, b = torch.randn(cols, generator=g).to(dtype), torch.randn(cols, generator=g).to(dtype)
            assert_same(cf(x, w, b), layer_norm(x, w, b))
    x = torch.randn(1031, 8, generator=g).to(dtype)
    w, b = torch.randn(1031, generator=g).to(dtype), torch.randn(1031, generator=g).to(dtype)
    assert_same(cf(x.t(), w, b), layer_norm(x.t(), w, b))


def test_amax_of_rows_keeps_nan():
    """The max reduction's NaN flag (an int as wide as the lane) still reports NaN."""

    def f(x):
        return x.amax(-1)

    cf = compiled(f)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(64, 1031).to(dtype)
        x[3, 1030] = float("nan")
        x[7, 0] = float("nan")
        x[9] = float("-inf")
        assert_same(cf(x), f(x))


# -- the schedule: the next row is prefetched, only where it helps ---------------------------------


def _funcs(fn: Any, *args: Any) -> list[Any]:
    cf = compiled(fn)
    cf(*args)
    return schedule_program(lower(cf.graphs[0], FUSION), SchedulePolicy())


def _prefetches(func: Any) -> list[tuple[Prefetch, Loop]]:
    out: list[tuple[Prefetch, Loop]] = []

    def visit(stmts: Any, loop: Loop | None) -> None:
        for s in stmts:
            if isinstance(s, Prefetch):
                assert loop is not None
                out.append((s, loop))
            elif isinstance(s, Loop):
                visit(s.body, s)

    visit(func.body, None)
    return out


def test_row_kernel_prefetches_its_next_row():
    (func,) = _funcs(softmax_last, torch.randn(4, 10))
    ((pf, loop),) = _prefetches(func)
    assert loop.kind == "par" and pf.var == loop.var and pf.limit == loop.extent
    assert pf.buf == "in0"
    # the next row: offset at _i0 = 0 is one row (the row length), its extent the row length
    assert pf.offset.xreplace({loop.var: 0}) == pf.extent
    assert "prefetch %in0[" in func.text
    # and no prefetch without the policy, or in a kernel without a row reduction
    graph = compiled_graph(softmax_last, torch.randn(4, 10))
    (plain,) = schedule_program(lower(graph, FUSION), SchedulePolicy(prefetch=False))
    assert not _prefetches(plain)
    (add,) = _funcs(lambda x: x * 2 + 1, torch.randn(4, 10))
    assert not _prefetches(add)


def test_layer_norm_prefetches_the_row_not_the_weights():
    (func,) = _funcs(layer_norm, torch.randn(4, 10), torch.randn(10), torch.randn(10))
    assert [pf.buf for pf, _ in _prefetches(func)] == ["in0"]


def compiled_graph(fn: Any, *args: Any) -> Any:
    cf = compiled(fn)
    cf(*args)
    return cf.graphs[0]


# -- forced ISAs ----------------------------------------------------------------------------------

_CHILD = """
import sys, torch
sys.path.insert(0, {here!r})
import test_row_kernels as t
for fn in (t.softmax_last, t.log_softmax_last):
    for dtype in (torch.float32, torch.float64):
        t.run_softmax_cases(fn, dtype)
t.test_softmax_other_dims(torch.float32)
t.test_layer_norm_rows(torch.float32)
t.test_amax_of_rows_keeps_nan()
from cuvil_backend_cpu.toolchain import find_toolchain
print("isa", find_toolchain().isa)
"""


def _runnable(isa: str) -> bool:
    """Whether this CPU runs kernels built for ``isa`` (the toolchain's own check)."""
    from cuvil_backend_cpu.toolchain import ToolchainError, cpuinfo, isa_flags

    try:
        isa_flags(isa, cpuinfo())
    except ToolchainError:
        return False
    return True


@pytest.mark.slow  # ~30 s per ISA; `nox -s tests_isa` runs this file's other tests under each ISA
@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_row_kernels_with_forced_isa(isa):
    if not _runnable(isa):
        pytest.skip(f"this CPU cannot run {isa} kernels")
    here = str(Path(__file__).parent)
    env = {**os.environ, "CUVIL_CPU_ISA": isa, "CUVIL_PROGRESS": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(here=here)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"isa {isa}" in proc.stdout
