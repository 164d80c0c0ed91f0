"""Per-call overhead of a compiled function on the ``cpu`` target: what Cuvil adds to
every call around its kernels (argument checks, guards, size binding, the arena,
the wrapper's launches).

    python -m benchmarks.percall                 # from the repo root, in a dev venv
    python -m benchmarks.percall --calls 20000 --repeats 9

Cases: a tiny graph (``x + y`` on 4-element tensors: nearly all overhead), the
mission head of :mod:`benchmarks.workloads` (a branch sub-program, interpolate,
mean, matmul, softmax on (4,3,64,64)) and the BERT-like encoder layer at sequence
length 4 and d 64 (12 extern calls and a handful of kernels on tiny tensors; a
module: its parameter slots are checked per call), each next to eager on the same
inputs. Prints the median over ``repeats`` blocks of ``calls`` calls, in
microseconds per call. docs/runtime.md "Per-call cost" has the breakdown.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _block(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e6


def measure(fn: Callable[..., Any], args: tuple[Any, ...], calls: int, repeats: int) -> float:
    for _ in range(max(calls // 10, 10)):
        fn(*args)
    return statistics.median(_block(fn, args, calls) for _ in range(repeats))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    os.environ.setdefault("CUVIL_CACHE_DIR", tempfile.mkdtemp(prefix="cuvil-percall-"))
    torch.set_num_threads(1)
    import cuvil as cu
    from benchmarks.workloads import BertEncoderLayer, _prepare, head

    torch.manual_seed(0)
    x, y = torch.randn(4), torch.randn(4)
    bert = _prepare(BertEncoderLayer(d=64, heads=2, ffn=128))
    h = torch.randn(1, 4, 64)
    cases = [
        ("tiny graph: x + y, 4 elements", lambda x, y: x + y, (x, y), max(a.calls, 1)),
        ("mission head, (4,3,64,64)", head, (torch.randn(4, 3, 64, 64),), max(a.calls // 10, 1)),
        ("BERT-like layer, seq 4, d 64", bert, (h,), max(a.calls // 5, 1)),
    ]
    print(f"# per-call time, us (median of {a.repeats} blocks); {platform.processor() or platform.machine()}")
    print("| case | eager us | cuvil cpu us | cuvil - eager us |")
    print("|---|---:|---:|---:|")
    with torch.no_grad():
        for name, fn, args, calls in cases:
            compiled = cu.compile(fn, target="cpu", fallback="error")
            torch.testing.assert_close(compiled(*args), fn(*args))
            eager = measure(fn, args, calls, a.repeats)
            ours = measure(compiled, args, calls, a.repeats)
            print(f"| {name} | {eager:.1f} | {ours:.1f} | {ours - eager:+.1f} |")


if __name__ == "__main__":
    main()
