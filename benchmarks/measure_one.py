"""One implementation of one workload, measured in a fresh process: the time of
the first call (which includes compiling, and for torch.compile/Cuvil reading or
filling their on-disk caches), then a few steady calls, then the process's peak
resident set size (VmHWM, see :func:`peak_rss_mb`). Prints one JSON line on stdout.

    python -m benchmarks.measure_one --workload head --impl cuvil --target cpu --cache-dir /tmp/x

``--cache-dir`` becomes ``CUVIL_CACHE_DIR`` (impl ``cuvil``) or
``TORCHINDUCTOR_CACHE_DIR`` + ``TRITON_CACHE_DIR`` (impl ``torch_compile``); it is
set before torch is imported. ``benchmarks.run`` starts this module twice per
compiler with the same folder: cold (the folder empty) and warm (filled by the
cold run).

Only the standard library is imported at module level, so that the environment
is in place before torch (and cuvil) are imported; ``benchmarks.run`` reuses
:func:`build_impl` and :func:`tc_graph_count` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

IMPLS = ("eager", "torch_compile", "cuvil")
#: measured in process only (no compile-time children): onnxruntime with IOBinding
EXTRA_IMPLS = ("onnxruntime",)
#: seconds a compiler spent on one-time imports before its first call (reported apart)
_IMPORT_S: dict[str, float] = {}


def cache_env(impl: str, cache_dir: str | None) -> dict[str, str]:
    """The environment variables that point ``impl``'s on-disk caches at ``cache_dir``."""
    if not cache_dir:
        return {}
    if impl == "cuvil":
        return {"CUVIL_CACHE_DIR": cache_dir}
    if impl == "torch_compile":
        return {
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"),
        }
    return {}


def build_impl(impl: str, fn: Any, target: str) -> Callable[..., Any]:
    """``fn`` itself (eager), ``torch.compile(fn)`` with default settings, or
    ``cuvil.compile(fn, target=target)``."""
    if impl == "eager":
        return fn
    if impl == "torch_compile":
        import torch

        return torch.compile(fn)  # inductor, mode=None, dynamic=None: the defaults
    if impl == "cuvil":
        import cuvil as cu

        # the one-time import of torch._dynamo (torch's ShapeEnv needs it) happens here,
        # as torch.compile's happens in torch.compile(): neither counts as the first call
        _IMPORT_S["cuvil"] = cu.warmup()
        return cu.compile(fn, target=target)
    raise ValueError(f"unknown impl {impl!r}; known: {IMPLS}")


def tc_graph_count() -> int:
    """How many graphs torch.compile (Dynamo) has compiled in this process so far.

    Dynamo increments ``counters["stats"]["unique_graphs"]`` once per graph it hands
    to the backend and gets back compiled: a recompile (a guard failed, e.g. a new
    batch size) adds one, and so does each piece of a graph break.
    """
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def tc_graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    On Linux this is ``VmHWM`` from ``/proc/self/status``, not ``ru_maxrss``:
    ``getrusage`` keeps the high-water mark across ``execve``, so a child started
    by a large parent (``benchmarks.run``, with torch and inductor loaded) reports
    at least the parent's peak. ``VmHWM`` belongs to the address space, which
    ``execve`` replaces. Elsewhere, ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return ru_maxrss_mb()


def ru_maxrss_mb() -> float:
    # Linux reports ru_maxrss in KiB (macOS in bytes).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def measure(workload: str, impl: str, target: str, steady_calls: int, threads: int) -> dict[str, Any]:
    import torch

    from benchmarks.workloads import WORKLOADS

    torch.set_num_threads(threads)
    result: dict[str, Any] = {"workload": workload, "impl": impl, "target": target}
    fn, args = WORKLOADS[workload].build()
    try:
        tc_before = tc_graph_count() if impl == "torch_compile" else 0
        compiled = build_impl(impl, fn, target)
        t0 = time.perf_counter()
        compiled(*args)
        result["first_call_s"] = time.perf_counter() - t0
        if impl in _IMPORT_S:
            result["import_s"] = _IMPORT_S[impl]
        times = []
        for _ in range(steady_calls):
            t0 = time.perf_counter()
            compiled(*args)
            times.append(time.perf_counter() - t0)
        times.sort()
        result["steady_ms"] = times[len(times) // 2] * 1e3 if times else None
        if impl == "cuvil":
            stats = compiled.stats
            result["compiles"] = stats.compiles
            result["fallbacks"] = stats.fallbacks
            result["fallback_reasons"] = list(stats.fallback_reasons)
        elif impl == "torch_compile":
            result["compiles"] = tc_graph_count() - tc_before
            result["graph_breaks"] = tc_graph_breaks()
    except Exception as exc:  # reported, not raised: the parent puts it in the table
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
        result["traceback"] = traceback.format_exc()[-3000:]
    result["peak_rss_mb"] = peak_rss_mb()
    result["ru_maxrss_mb"] = ru_maxrss_mb()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", required=True)
    parser.add_argument("--impl", required=True, choices=IMPLS)
    parser.add_argument("--target", default="cpu", help="Cuvil target (impl cuvil)")
    parser.add_argument("--cache-dir", default=None, help="the compiler's on-disk cache folder")
    parser.add_argument("--steady-calls", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.update(cache_env(args.impl, args.cache_dir))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    result = measure(args.workload, args.impl, args.target, args.steady_calls, args.threads)
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
