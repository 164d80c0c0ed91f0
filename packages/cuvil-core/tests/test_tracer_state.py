"""The tracer's per-compile state: two threads compiling two functions at once do not
see each other's decomposition state (it is held by each tracer, not by a module), and
``Tracer.checkpoint`` / ``Tracer.rollback`` put back everything a rolled-back attempt
recorded ([Note: decompositions] in cuvil/frontend/decompose.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import cuvil as cu
from cuvil.frontend import decompose
from cuvil.frontend.tracer import Tracer


def _ops(compiled: Any) -> list[str]:
    (graph,) = compiled.graphs
    return [n.op if n.op != "extern" else f"extern:{n.attr('target')}" for n in graph.nodes]


class _Blocked:
    """``torch.lerp``'s reference, held at its first call until :attr:`release` is set:
    the thread that made that call is then inside a decomposition."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CUVIL_WARM", "0")  # a warm start would not trace at all
        self.original = decompose._references()[torch.lerp]
        self.entered, self.release = threading.Event(), threading.Event()
        monkeypatch.setitem(decompose._references(), torch.lerp, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60), "the other compile never finished"
        return self.original(*args, **kwargs)


def _lerp_in_a_thread(blocked: _Blocked) -> tuple[threading.Thread, dict[str, Any]]:
    """Compile and call ``lerp`` in a thread, stopped inside its decomposition."""

    def lerp(x, y):
        return torch.lerp(x, y, 0.5) * 2

    done: dict[str, Any] = {}

    def work() -> None:
        try:
            f = cu.compile(lerp, target="reference", fallback="error")
            x, y = torch.randn(3, 4), torch.randn(3, 4)
            done["ok"] = torch.allclose(f(x, y), lerp(x, y))
            done["ops"] = _ops(f)
        except BaseException as e:  # reported by the test, not lost in the thread
            done["error"] = e

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while not blocked.entered.wait(0.05):
        assert thread.is_alive(), f"the decomposition never started: {done}"
    return thread, done


def _finish(blocked: _Blocked, thread: threading.Thread, done: dict[str, Any]) -> None:
    blocked.release.set()
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in done, done.get("error")
    assert done["ok"] and not [op for op in done["ops"] if op.startswith("extern")], done


def test_a_layout_query_while_another_thread_decomposes(monkeypatch) -> None:
    # while one thread runs a reference, another's `is_contiguous()` is eager's answer
    # (a module-global "inside a reference" flag answered True: the wrong branch)
    blocked = _Blocked(monkeypatch)
    thread, done = _lerp_in_a_thread(blocked)
    try:

        def branch(x):
            if x.t().is_contiguous():
                return x + 1
            return x - 1

        f = cu.compile(branch, target="reference", fallback="error")
        x = torch.randn(3, 4)
        torch.testing.assert_close(f(x), branch(x))
    finally:
        _finish(blocked, thread, done)


def test_a_stride_query_while_another_thread_decomposes(monkeypatch) -> None:
    # user code asking x.stride() is refused, whatever another thread is decomposing
    blocked = _Blocked(monkeypatch)
    thread, done = _lerp_in_a_thread(blocked)
    try:
        f = cu.compile(lambda x: x * x.t().stride()[0], target="reference", fallback="error")
        with pytest.raises(cu.CompileError):
            f(torch.randn(3, 4))
    finally:
        _finish(blocked, thread, done)


def test_the_same_call_decomposes_in_two_threads_at_once(monkeypatch) -> None:
    # a call another thread is decomposing is not "a reference calling itself" here:
    # both compiles record declared ops, no extern node
    blocked = _Blocked(monkeypatch)
    thread, done = _lerp_in_a_thread(blocked)
    try:

        def lerp_too(x, y):
            return torch.lerp(x, y, 0.25) + 1

        f = cu.compile(lerp_too, target="reference", fallback="error")
        x, y = torch.randn(2, 5), torch.randn(2, 5)
        torch.testing.assert_close(f(x, y), lerp_too(x, y))
        assert not [op for op in _ops(f) if op.startswith("extern")], _ops(f)
    finally:
        _finish(blocked, thread, done)


def _state(tracer: Tracer) -> tuple[Any, ...]:
    return (
        list(tracer.nodes),
        list(tracer.inputs),
        list(tracer.lifted),
        dict(tracer._consts),
        set(tracer._names),
        set(tracer.seen_data_sizes),
        set(tracer.ctx.data_symbols),
        dict(tracer.ctx.hints or {}),
        dict(tracer.layout_guards),
    )


def test_rollback_forgets_what_was_recorded_since_the_checkpoint() -> None:
    tracer = Tracer("f")
    x: Any = tracer.add_input("x", torch.randn(2, 3), symbolic=True)
    with tracer.mode():
        x = x + 1
    before = _state(tracer)
    cp = tracer.checkpoint()
    w = torch.ones(3)
    with tracer.mode():
        y = x * w + 2.5  # a lifted tensor, a new constant, two nodes
        tracer.add_input("extra", torch.randn(4), symbolic=True)  # a name and a size hint
        tracer.layout_guards[0] = (0, (1, 0), "x")
    assert tracer.recorded_since(cp) and _state(tracer) != before
    tracer.rollback(cp)
    assert _state(tracer) == before
    # what was forgotten is recorded anew under the same names
    with tracer.mode():
        x * w
    assert [lifted.name for lifted in tracer.lifted] == ["const0"]
    tracer.add_input("extra", torch.randn(4), symbolic=True)
    del y


def test_a_kept_recording_is_not_rolled_back() -> None:
    tracer = Tracer("f")
    x = tracer.add_input("x", torch.randn(2, 3), symbolic=False)
    with decompose.attempt(tracer) as recording:
        with tracer.mode():
            x + 1
        recording.keep()
    assert recording.kept and [n.op for n in tracer.nodes if n.op != "const"] == ["add"]
    with decompose.attempt(tracer) as recording:
        with tracer.mode():
            x - 1
        raise RuntimeError("swallowed: the attempt is rolled back")
    assert not recording.kept and [n.op for n in tracer.nodes if n.op != "const"] == ["add"]


def test_converted_control_flow_while_another_thread_traces(monkeypatch) -> None:
    # a converted `if` records into its own thread's tracer, not into the one another
    # thread's capture started last; and neither capture leaves its tracer active, nor
    # torch's process-wide "compiling" flag set ([Note: captures count as compiling])
    monkeypatch.setenv("CUVIL_WARM", "0")
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", torch.compiler.is_compiling())
    original = decompose._references()[torch.lerp]
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def ref(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # thread A: resumes once B's capture is under way
            a_in.set()
            assert b_in.wait(60)
        elif len(calls) == 2:  # thread B: resumes once A has finished
            b_in.set()
            assert a_done.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setitem(decompose._references(), torch.lerp, ref)

    def branchy(x, y):
        z = torch.lerp(x, y, 0.5)
        if z.sum() > 0:
            return z + 1
        return z - 1

    def other(x, y):
        return torch.lerp(x, y, 0.25) * 3

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    results: dict[str, Any] = {}

    def work(name: str, fn: Any, done: threading.Event | None) -> None:
        try:
            results[name] = cu.compile(fn, target="reference", fallback="error")(x, y)
        except BaseException as e:
            results[name] = e
        finally:
            if done is not None:
                done.set()

    a = threading.Thread(target=work, args=("a", branchy, a_done), daemon=True)
    a.start()
    assert a_in.wait(60)
    b = threading.Thread(target=work, args=("b", other, None), daemon=True)
    b.start()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    for name in ("a", "b"):
        assert not isinstance(results[name], BaseException), results[name]
    torch.testing.assert_close(results["a"], branchy(x, y))
    torch.testing.assert_close(results["b"], other(x, y))
    assert Tracer.current() is None
    assert not torch.compiler.is_compiling()  # A ended first, B restored what it saw


def test_an_extern_argument_without_an_attribute_form_is_a_located_error() -> None:
    tracer = Tracer("f")
    x = tracer.add_input("x", torch.randn(3, 3), symbolic=False)
    with pytest.raises(cu.CompileError, match="cannot record an argument of an extern torch call") as e:
        tracer.extern(torch.trace, (x, object()), {})
    assert e.value.loc is not None and e.value.loc.file == __file__
