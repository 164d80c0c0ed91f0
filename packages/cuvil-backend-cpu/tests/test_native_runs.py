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


def cache_step(
    cache_k: torch.Tensor, cache_v: torch.Tensor, pos: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """A static cache's step: two kernels, the two writes of the argument caches in place, then
    two kernels reading the written caches (the writes sit inside one native run)."""
    k = x * 2 + 1
    v = torch.tanh(x)
    cache_k.index_copy_(2, pos, k)
    cache_v.index_copy_(2, pos, v)
    return torch.exp(cache_k - cache_k.amax(-1, keepdim=True)).sum(-1) + cache_v.sum(-1)


def _caches(seq: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seq)
    return torch.randn(2, 3, seq, 5, generator=g), torch.randn(2, 3, seq, 5, generator=g)


def test_cache_writes_in_place_run_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """``index_copy_`` into an argument, marked to write it in place ([Note: updates in place]),
    is a step of the run: the caller's caches as eager leaves them, results bit for bit those of
    the steps from Python, at several positions and cache lengths."""
    from cuvil_ir.graph_ir.ops import core

    written: list[str] = []  # the writes run from Python (the opaque extern's reference)
    real = core.Extern.reference
    spy = staticmethod(lambda *a, **k: written.append(k["target"]) or real(*a, **k))
    monkeypatch.setattr(core.Extern, "reference", spy)
    x = torch.randn(2, 3, 1, 5)
    native = compiled(cache_step, True, monkeypatch, *_caches(), torch.tensor([0]), x)
    python = compiled(cache_step, False, monkeypatch, *_caches(), torch.tensor([0]), x)
    assert any(s.in_place for r in executable_of(native)._runner.runs for s in r.steps), executable_of(
        native
    ).stages["wrapper"]
    for seq, at in ((9, 3), (9, 8), (9, 0), (12, 11), (12, 11)):
        x = torch.randn(2, 3, 1, 5)
        pos = torch.tensor([at])
        ek, ev = _caches(seq)
        expected = cache_step(ek, ev, pos, x)
        pk, pv = _caches(seq)
        b = python(pk, pv, pos, x)
        for again in range(2):  # from Python, then natively (the same writes again: same values)
            nk, nv = _caches(seq)
            before = len(written)
            a = native(nk, nv, pos, x)
            if again:  # (a binding's second call at the latest runs natively)
                assert len(written) == before  # the run wrote the caches, not torch's method
            assert torch.equal(a, b) and torch.equal(nk, pk) and torch.equal(nv, pv)
            assert torch.equal(nk, ek)
            torch.testing.assert_close(nv, ev)  # (our tanh, eager's: within rounding)
            torch.testing.assert_close(a, expected)
    assert native.stats.compiles == 1
    used = native_runs_used(native)
    assert used and all(all(v) for v in used.values()), used


def test_a_run_that_writes_an_argument_needs_a_call_that_may(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program run outside a call that checked its arguments' storage (the executable
    called directly, as a loaded artifact's reference paths are) clones the cache: the caller's
    tensors stay as they were, the results are the updated values."""
    x, pos = torch.randn(2, 3, 1, 5), torch.tensor([4])
    native = compiled(cache_step, True, monkeypatch, *_caches(), pos, x)
    exe = executable_of(native)
    for _ in range(3):  # (a binding's first call, then its tables)
        ck, cv = _caches()
        before = ck.clone(), cv.clone()
        outs = exe(ck, cv, pos, x)
        assert torch.equal(ck, before[0]) and torch.equal(cv, before[1])
        ek, ev = _caches()
        expected = cache_step(ek, ev, pos, x)
        flat = [t for t in outs if isinstance(t, torch.Tensor)]
        assert any(torch.equal(t, ek) for t in flat)
        assert any(t.shape == ev.shape and torch.allclose(t, ev) for t in flat)
        assert any(t.shape == expected.shape and torch.allclose(t, expected) for t in flat)


def test_a_cache_write_out_of_range_raises_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil_runtime import native_runs

    failed: list[int] = []
    real = native_runs.failure
    monkeypatch.setattr(native_runs, "failure", lambda t, i, z: failed.append(i) or real(t, i, z))
    x = torch.randn(2, 3, 1, 5)
    for native in (True, False):
        f = compiled(cache_step, native, monkeypatch, *_caches(), torch.tensor([0]), x)
        for bad in (9, -1, 9):  # natively (the compiling call was the binding's first)
            ck, cv = _caches()
            before = ck.clone(), cv.clone()
            with pytest.raises(IndexError, match="index_copy_"):
                f(ck, cv, torch.tensor([bad]), x)
            assert torch.equal(ck, before[0]) and torch.equal(cv, before[1])
        assert len(failed) == (3 if native else 0)  # the step runner's failure, raised as torch's
        failed.clear()
        ck, cv = _caches()
        ek, ev = _caches()
        torch.testing.assert_close(f(ck, cv, torch.tensor([2]), x), cache_step(ek, ev, torch.tensor([2]), x))
        assert torch.equal(ck, ek)
        torch.testing.assert_close(cv, ev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_the_native_index_copy_matches_torch(dtype: torch.dtype) -> None:
    """``cuvil_index_copy`` (step_runner.c) against ``Tensor.index_copy_``: every rank up to 4,
    every dim, strided sources, several and repeated-free indices, through the step's own
    ``prepare``."""
    import ctypes

    from cuvil_backend_cpu import step_runner
    from cuvil_backend_cpu.kernel_cache import KernelCache
    from cuvil_ir.graph_ir.nodes import KV, Ref
    from cuvil_runtime.target import NativeOperand

    ne = step_runner.in_place_native(KernelCache())
    assert ne is not None
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 4)(ne.address)
    g = torch.Generator().manual_seed(0)

    def op(t: torch.Tensor) -> NativeOperand:
        return NativeOperand(t.dtype, tuple(t.shape), tuple(t.stride()))

    for shape in ((7,), (3, 5), (2, 3, 4), (2, 1, 6, 3)):
        for dim in range(len(shape)):
            n = min(3, shape[dim])
            index = torch.randperm(shape[dim], generator=g)[:n]
            src_shape = list(shape)
            src_shape[dim] = n
            wide = torch.randn(*src_shape[:-1], src_shape[-1] * 2, generator=g)
            for src in (wide[..., : src_shape[-1]], torch.randn(*src_shape, generator=g)):  # strided, dense
                src = (src > 0) if dtype == torch.bool else (src * 100).to(dtype)
                dst = torch.randn(*shape, generator=g)
                dst = (dst > 0) if dtype == torch.bool else (dst * 100).to(dtype)
                expected = dst.clone().index_copy_(dim, index, src)
                attrs = {
                    "target": step_runner.INDEX_COPY, "in_place": True, "mutates": 0, "kwargs": KV(()),
                    "args": (Ref(0), dim - len(shape) if dim % 2 else dim, Ref(1), Ref(2)),
                }  # fmt: skip
                made = ne.prepare([op(dst), op(dst), op(index), op(src)], attrs)
                assert made is not None and made[3][0] == "block"
                block = (ctypes.c_int64 * len(made[3][1]))(*(v for _, v in made[3][1]))
                assert fn(dst.data_ptr(), index.data_ptr(), src.data_ptr(), ctypes.addressof(block)) == 0
                assert torch.equal(dst, expected), (shape, dim, src.stride())
                bad = index.clone()
                bad[-1] = shape[dim]
                assert fn(dst.data_ptr(), bad.data_ptr(), src.data_ptr(), ctypes.addressof(block)) == 3
                assert torch.equal(dst, expected)  # nothing written
    # what it does not take runs torch's: another method, a converting source, an int32 index
    d, s, i = torch.zeros(3, 4), torch.ones(3, 1), torch.tensor([1])
    base = {"target": step_runner.INDEX_COPY, "in_place": True, "mutates": 0, "kwargs": KV(())}
    args = (Ref(0), 1, Ref(1), Ref(2))
    assert ne.prepare([op(d), op(d), op(i), op(s)], {**base, "args": args}) is not None
    assert (
        ne.prepare([op(d), op(d), op(i), op(s)], {**base, "args": args, "target": "torch.Tensor.index_add_"})
        is None
    )
    assert ne.prepare([op(d), op(d), op(i), op(s.double())], {**base, "args": args}) is None
    assert ne.prepare([op(d), op(d), op(i.int()), op(s)], {**base, "args": args}) is None
    assert ne.prepare([op(d), op(d), op(i), op(s)], {**base, "args": args, "in_place": False}) is None
