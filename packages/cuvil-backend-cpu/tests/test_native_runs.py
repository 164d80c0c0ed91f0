"""Native runs ([Note: native runs] in cuvil_runtime.native_runs): consecutive steps of a
program called by the step runner in one call, against the same steps called from Python and
against eager. (The whole corpus is compared both ways in test_conformance.py.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import cuvil as cu
import cuvil.api
from cuvil_backend_cpu.testing import executable_of, native_runs_here, native_runs_used
from cuvil_runtime.cache import CompileCache

pytestmark = pytest.mark.skipif(
    not native_runs_here(), reason="emulated kernels (another ISA under qemu) take tensors: no native runs"
)


def softmax(x: torch.Tensor) -> torch.Tensor:  # two kernels in a row: the max and sum, then the division
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(-1, keepdim=True)


def divide(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # two kernels that divide
    q = x // y
    return q, torch.exp(q.float()).sum(-1)


def many(*xs: torch.Tensor) -> torch.Tensor:  # kernels of many operands
    a = xs[0] * xs[1]
    for x in xs[2:]:
        a = a + torch.exp(x)
    return torch.exp(a - a.amax(-1, keepdim=True)) / a.sum(-1, keepdim=True)


def compiled(f: Callable[..., Any], native: bool, monkeypatch: pytest.MonkeyPatch, *example: Any) -> Any:
    """``f`` compiled (by a first call with ``example``) with native runs on or off."""
    monkeypatch.setenv("CUVIL_NATIVE_RUNS", "1" if native else "0")
    monkeypatch.setattr(cuvil.api, "_EXECUTABLES", CompileCache())  # (a wrapper made under the setting)
    c = cu.compile(f, target="cpu", fallback="error")
    with torch.no_grad():
        c(*example)
    return c


def runs(c: Any) -> list[int]:
    """The step count of each native run of ``c``'s latest wrapper."""
    return [len(r.steps) for r in executable_of(c)._runner.runs]


def test_a_run_of_kernels_matches_python_steps_and_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    native = compiled(softmax, True, monkeypatch, torch.randn(4, 8))
    python = compiled(softmax, False, monkeypatch, torch.randn(4, 8))
    for rows, cols in ((4, 8), (1, 33), (7, 5), (4, 8)):
        x = torch.randn(rows, cols)
        b = python(x)
        for _ in range(2):  # a binding's first call runs the steps from Python, the second natively
            a = native(x)
            assert a.dtype == b.dtype == torch.float32
            assert torch.equal(a, b)
            torch.testing.assert_close(a, softmax(x))
    assert runs(native) == [2] and runs(python) == []
    assert native.stats.compiles == 1
    assert sorted(native_runs_used(native).values()) == [[True]] * 3  # three bindings, each made its tables


def test_a_binding_called_once_makes_no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first call runs each step from Python (a dynamic cache's decode steps are each a new
    binding: making tables would cost them more than a native run saves)."""
    f = compiled(softmax, True, monkeypatch, torch.randn(4, 8))
    for cols in range(3, 9):
        x = torch.randn(2, cols)
        torch.testing.assert_close(f(x), softmax(x))
    assert native_runs_used(f) == {}
    f(x)
    assert list(native_runs_used(f).values()) == [[True]]


def test_a_kernel_failing_in_a_run_raises_as_from_python(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = torch.randint(-9, 9, (4, 8)), torch.randint(1, 5, (4, 8))
    for native in (True, False):
        f = compiled(divide, native, monkeypatch, x, y)
        assert runs(f) == ([2] if native else [])
        zero = y.clone()
        zero[2, 3] = 0
        for _ in range(2):  # from Python, then natively
            with pytest.raises(ZeroDivisionError, match="integer division or modulo by zero"):
                f(x, zero)
        assert list(native_runs_used(f).values()) == ([[True]] if native else [])
        q, s = f(x, y)  # the next call runs again
        assert torch.equal(q, x // y)
        torch.testing.assert_close(s, torch.exp((x // y).float()).sum(-1))


def test_steps_of_many_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    xs = [torch.randn(3, 17) * 0.1 for _ in range(14)]
    native = compiled(many, True, monkeypatch, *xs)
    python = compiled(many, False, monkeypatch, *xs)
    assert runs(native), executable_of(native).stages["wrapper"]
    native(*xs)
    assert torch.equal(native(*xs), python(*xs))
    assert all(all(v) for v in native_runs_used(native).values())
    torch.testing.assert_close(native(*xs), many(*xs))


@pytest.mark.parametrize("fmt", ["int8", "int4", "int4-a8"])
def test_a_quantized_linear_runs_natively_for_few_rows(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32)).eval()
    model = cu.quantize(model, fmt, group_size=32 if fmt != "int8" else 0)
    native = compiled(model, True, monkeypatch, torch.randn(1, 64))
    python = compiled(model, False, monkeypatch, torch.randn(1, 64))
    with torch.no_grad():
        # int4-a8 rounds the second linear's activations (SiLU's results) to int8 codes: a SiLU
        # one ulp off eager's (our exp against torch's, which differs by host) can move a code
        # by one, which moves that row's outputs by about d * |w| (1e-3 here). The two paths of
        # one compiled model must agree bit for bit.
        tol = 2e-3 if fmt == "int4-a8" else 2e-5
        for rows in (1, 3, 200, 1):
            x = torch.randn(rows, 64)
            b = python(x)
            for _ in range(2):  # from Python, then natively
                a = native(x)
                assert torch.equal(a, b)
                torch.testing.assert_close(a, model(x), rtol=tol, atol=tol)
    assert runs(native) and not runs(python)
    used = native_runs_used(native)
    # few rows: the GEMV from the step runner; 200 rows: more than the GEMV takes, from Python
    assert all(all(v) for k, v in used.items() if 200 not in k) and not any(
        any(v) for k, v in used.items() if 200 in k
    ), used


def test_threads_call_one_program_with_different_sizes_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    f = compiled(softmax, True, monkeypatch, torch.randn(2, 3))
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for i in range(30):
                x = torch.randn(1 + (seed + i) % 5, 3 + (seed * i) % 7, generator=g)
                torch.testing.assert_close(f(x), softmax(x))
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert runs(f) == [2] and f.stats.compiles == 1
