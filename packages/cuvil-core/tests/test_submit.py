"""``f.submit(...)``: a ``concurrent.futures.Future``; arguments and compiles on the caller's
thread, the run on the runtime's pool, FIFO per function, errors in the Future,
cancellation before start."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
import torch

import cuvil as cu
from cuvil.errors import CompileError


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference"] + (["cpu"] if _available("cpu") else [])


@pytest.mark.parametrize("target", TARGETS)
def test_submit_returns_futures_with_eagers_results_at_every_size(target):
    def f(x, w):
        return torch.softmax(x @ w + 1.0, dim=-1)

    cf = cu.compile(f, target=target, fallback="error")
    w = torch.randn(8, 4)
    xs = [torch.randn(n, 8) for n in (3, 5, 3, 7)]
    futures = [cf.submit(x, w) for x in xs]
    assert all(isinstance(fu, Future) for fu in futures)
    for x, fu in zip(xs, futures):
        torch.testing.assert_close(fu.result(timeout=60), f(x, w))
    assert cf.stats.compiles == 1


def test_calls_of_one_function_run_in_submission_order():
    """The pool has several threads; one function's calls still run one at a time, in order."""
    cf = cu.compile(lambda x: x * 2, target="reference", fallback="error")
    ran: list[int] = []

    def step(i: int) -> int:
        time.sleep(0.002 * ((i * 7) % 5))  # uneven lengths: a parallel pool would reorder them
        ran.append(i)
        return i

    futures = [cf._queue.submit(lambda i=i: step(i)) for i in range(30)]
    assert [fu.result(timeout=60) for fu in futures] == list(range(30))
    assert ran == list(range(30))
    calls = [cf.submit(torch.full((2,), float(i))) for i in range(10)]
    assert [fu.result(timeout=60).tolist() for fu in calls] == [[2.0 * i] * 2 for i in range(10)]


def test_errors_surface_in_the_future_and_compile_errors_at_submit():
    def f(x, y):
        return x // y

    cf = cu.compile(f, target="reference", fallback="error")
    good = cf.submit(torch.tensor([4]), torch.tensor([2]))
    bad = cf.submit(torch.tensor([4]), torch.tensor([0]))
    assert good.result(timeout=60).tolist() == [2]
    with pytest.raises((ZeroDivisionError, RuntimeError)):
        bad.result(timeout=60)
    with pytest.raises(TypeError, match="arguments|argument"):
        cf.submit(torch.tensor([4]))  # a wrong arity is the caller's error, raised at once

    def branchy(x):
        if x.sum() > 0:
            return x
        return x.sum()  # the branches disagree: a compile error

    with pytest.raises(CompileError):
        cu.compile(branchy, target="reference", fallback="error").submit(torch.randn(3))


def test_a_call_cancelled_before_it_starts_is_skipped_and_the_rest_still_run_in_order():
    started = threading.Event()
    release = threading.Event()

    def slow(x):
        return x + 1

    cf = cu.compile(slow, target="reference", fallback="error")
    cf(torch.zeros(1))  # compiled: the runs below only execute
    blocker = cf._queue.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(30)
    a = cf.submit(torch.zeros(1))
    b = cf.submit(torch.ones(1))
    c = cf.submit(torch.full((1,), 2.0))
    assert b.cancel()  # still queued behind the blocker
    release.set()
    assert blocker.result(timeout=60) is not None
    assert a.result(timeout=60).tolist() == [1.0] and c.result(timeout=60).tolist() == [3.0]
    assert b.cancelled()


def test_the_caller_thread_is_free_while_a_call_runs():
    """The run is on the pool: submit returns before a long program finishes."""
    cf = cu.compile(lambda a, b: (a @ b).relu().sum(), target="reference", fallback="error")
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    cf(a, b)
    t0 = time.perf_counter()
    futures = [cf.submit(a, b) for _ in range(8)]
    submitted = time.perf_counter() - t0
    for fu in futures:
        fu.result(timeout=60)
    total = time.perf_counter() - t0
    assert submitted < total


# -- exit and done callbacks (issue 26 item 10): each scenario in a real child process,
# which must print the expected line, exit 0 and print no traceback within the timeout.

_PRELUDE = """
import sys, threading, time
import torch
import cuvil as cu
from cuvil.submit import set_workers
set_workers(int(sys.argv[1]))
"""


def _child(tmp_path, body: str, workers: int = 2) -> str:
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "child.py"
    script.write_text(_PRELUDE + textwrap.dedent(body))
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(workers)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child process hung (60 s); stdout: {e.stdout!r} stderr: {e.stderr!r}")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "exception calling callback" not in done.stderr, done.stderr
    return done.stdout


def test_a_non_daemon_thread_waiting_on_futures_does_not_keep_the_process_from_exiting(tmp_path):
    out = _child(
        tmp_path,
        """
        cf = cu.compile(lambda x: x * 2, target="reference", fallback="error")
        cf(torch.ones(2))
        futures = [cf.submit(torch.full((2,), float(i))) for i in range(20)]

        def waiter():  # waits after the main thread has returned; submits more meanwhile
            more = [cf.submit(torch.full((2,), 1.0)) for _ in range(5)]
            print("sum", sum(f.result().sum().item() for f in futures + more), flush=True)

        threading.Thread(target=waiter).start()
        """,
    )
    assert out.split() == ["sum", str(2.0 * 2 * sum(range(20)) + 5 * 4.0)]


@pytest.mark.parametrize("workers", [1, 2])
def test_calls_chained_through_done_callbacks_complete_during_shutdown(tmp_path, workers):
    out = _child(
        tmp_path,
        """
        cf = cu.compile(lambda x: x + 1, target="reference", fallback="error")
        cf(torch.zeros(()))
        seen = []

        def chain(fut):
            seen.append(fut.result().item())
            if len(seen) < 6:
                cf.submit(fut.result()).add_done_callback(chain)
            else:
                print("chain", seen, flush=True)

        cf.submit(torch.zeros(())).add_done_callback(chain)  # the main thread returns at once
        """,
        workers,
    )
    assert out.strip() == "chain [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]"


def test_calls_pending_when_the_main_thread_returns_all_complete(tmp_path):
    out = _child(
        tmp_path,
        """
        f = cu.compile(lambda a, b: (a @ b).relu().sum(), target="reference", fallback="error")
        g = cu.compile(lambda a: a.sum(), target="reference", fallback="error")
        a = torch.randn(256, 256)
        f(a, a), g(a)
        futures = [f.submit(a, a) for _ in range(30)] + [g.submit(a) for _ in range(30)]

        def report(_):
            if all(x.done() for x in futures):
                ok = all(not x.cancelled() and x.exception() is None for x in futures)
                print("all", ok, flush=True)

        for fu in futures:
            fu.add_done_callback(report)
        """,
    )
    assert out.split()[-2:] == ["all", "True"]  # the last to finish reports (one or both lines)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_done_callback_waiting_on_a_nested_submit_of_the_same_function_does_not_deadlock(tmp_path, workers):
    out = _child(
        tmp_path,
        """
        cf = cu.compile(lambda x: x * 3, target="reference", fallback="error")
        cf(torch.ones(1))
        got = []
        gate = threading.Event()
        cf._queue.submit(lambda: gate.wait(30))  # the call below runs on the pool, callback attached
        fut = cf.submit(torch.ones(1))
        fut.add_done_callback(lambda _: got.append(cf.submit(torch.full((1,), 2.0)).result().item()))
        later = cf.submit(torch.full((1,), 5.0))  # queued behind the first: still in order
        gate.set()
        print("first", fut.result().item(), "later", later.result(timeout=30).item(), flush=True)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        print("nested", got, flush=True)
        """,
        workers,
    )
    assert out.split("\n")[:2] == ["first 3.0 later 15.0", "nested [6.0]"]
