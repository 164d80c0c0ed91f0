"""Benchmark eager PyTorch, torch.compile (inductor: default, and mode="reduce-overhead")
and Cuvil's ``cuda`` target (CUDA Graphs on, and ``cuda_graphs=False``) on one GPU,
on the workloads of ``benchmarks/workloads.py`` at GPU sizes.

    python -m benchmarks.gpu                              every workload, at most ~7 min
    python -m benchmarks.gpu --quick                      ~1.5 min: short timings, no child processes
    python -m benchmarks.gpu --workloads gelu_mlp,head
    TRITON_INTERPRET=1 python -m benchmarks.gpu --smoke --workloads head --out /tmp/gpubench
    benchmarks/gpu.sh                                     install the packages, then run this (GPU machine)

Writes ``<out>/gpu_latest.md`` (tables) and ``<out>/gpu_latest.json`` (raw
numbers), rewritten after every measurement so that a run stopped early keeps what
it measured. A global deadline (``--budget``, 420 s; ``--quick`` 100 s) skips the
remaining implementations and workloads, with a note, rather than overrunning.

Without a CUDA GPU it exits with status 2, unless ``--smoke``: the same code paths
on CPU tensors with tiny shapes, the ``cuda`` target running its kernels in
Triton's interpreter (``TRITON_INTERPRET=1`` must be set before the process
starts); CUDA Graphs, CUDA-event timing and GPU memory are skipped there. What
each column means: benchmarks/README.md, section "GPU run".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()  # the budget counts from the start of the process

import torch  # noqa: E402

from benchmarks import percall, report  # noqa: E402
from benchmarks.measure_one import build_impl, cache_env  # noqa: E402
from benchmarks.run import (  # noqa: E402
    ROOT,
    _cmd,
    check,
    describe_machine,
    log,
    run_json_child,  # noqa: E402
    short_error,
    time_round_robin,
)
from benchmarks.workloads import (  # noqa: E402
    DTYPE_ENV,
    WORKLOADS,
    BertEncoderLayer,
    Workload,
    _prepare,
    bench_dtype,
    select,
)

#: the size (``Workload.inputs(size)``: batch or rows) timed on the GPU. The CPU sizes
#: of the small workloads are scaled up; ResNet-18 keeps the batch its name says.
GPU_SIZES = {
    "softmax_dropout": 32768,  # rows x 1024
    "layernorm_gelu": 32768,  # rows x 1024
    "gelu_mlp": 4096,  # batch x 768
    "bert_encoder": 64,  # batch x seq 128 x 256
    "gpt2_block": 16,  # batch x seq 128 x 768
    "resnet18_b1": 1,
    "resnet18_b8": 8,
    "head": 256,  # batch x 3 x 64 x 64
}
#: ``--smoke``: tiny shapes (Triton's interpreter runs kernels in numpy on the host)
SMOKE_SIZES = {
    "softmax_dropout": 64,
    "layernorm_gelu": 64,
    "gelu_mlp": 4,
    "bert_encoder": 1,
    "gpt2_block": 1,
    "resnet18_b1": 1,
    "resnet18_b8": 2,
    "head": 2,
}

#: implementation key -> label; the order is the table's
IMPLS = {
    "eager": "eager",
    "torch_compile": "torch.compile",
    "torch_compile_ro": "torch.compile reduce-overhead",
    "cuvil": "cuvil (graphs)",
    "cuvil_nograph": "cuvil (no graphs)",
}
#: measured first for every workload (phase 1); reduce-overhead comes last (phase 3)
CORE_IMPLS = ("eager", "cuvil", "cuvil_nograph", "torch_compile")
#: seconds that must be left (besides the per-call reserve) to start one of them
NEED_S = {"eager": 3, "cuvil": 15, "cuvil_nograph": 10, "torch_compile": 25, "torch_compile_ro": 15}


class OutOfTime(BaseException):
    """Raised by the SIGALRM hard stop (a BaseException: torch's ``except Exception`` must
    not swallow it)."""


class Budget:
    """The global deadline: ``total_s`` from process start; ``reserve_s`` of it kept for
    the per-call section, which runs last."""

    def __init__(self, total_s: float, reserve_s: float) -> None:
        self.total_s = total_s
        self.deadline = _T0 + total_s
        self.reserve_s = reserve_s
        self.skipped: list[str] = []

    def left(self, reserve: bool = True) -> float:
        return self.deadline - time.perf_counter() - (self.reserve_s if reserve else 0.0)

    def allows(self, what: str, need_s: float, reserve: bool = True) -> bool:
        left = self.left(reserve)
        if left >= need_s:
            return True
        self.skipped.append(
            f"{what}: skipped, time budget ({max(left, 0):.0f} s left, ~{need_s:.0f} s needed)"
        )
        log(f"  {self.skipped[-1]}")
        return False


# -- device --------------------------------------------------------------------------------------


def _sync_fn(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def on_device(fn: Any, args: tuple[Any, ...], device: str) -> tuple[Any, tuple[Any, ...]]:
    """``fn`` and ``args`` moved to ``device``: a module's parameters and buffers, and the
    tensors a plain function reads from its globals (``head``'s ``w``; the function is
    rebuilt on a copy of its globals, so the workload module is left as it was)."""
    if isinstance(fn, torch.nn.Module):
        fn = fn.to(device)
    elif isinstance(fn, types.FunctionType):
        env = dict(fn.__globals__)
        for name in fn.__code__.co_names:
            if isinstance(env.get(name), torch.Tensor):
                env[name] = env[name].to(device)
        fn = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    return fn, tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def build_on(wl: Workload, size: int, device: str) -> tuple[Any, tuple[Any, ...]]:
    return on_device(wl.build_fn(), wl.inputs(size), device)


def make_impl(name: str, fn: Any) -> Callable[..., Any]:
    """The callable of implementation ``name`` (torch.compile: after ``torch._dynamo.reset()``)."""
    if name in ("torch_compile", "torch_compile_ro"):
        torch._dynamo.reset()  # nothing carried over from an earlier workload or the other mode
    if name == "torch_compile_ro":
        return torch.compile(fn, mode="reduce-overhead")
    if name == "cuvil_nograph":
        import cuvil as cu

        return cu.compile(fn, target="cuda", cuda_graphs=False)
    return build_impl(name, fn, "cuda")  # eager, torch.compile (defaults), cu.compile(target="cuda")


def _mb(n: int) -> float:
    return n / 2**20


def back_to_back_ms(impl: Callable[..., Any], args: tuple[Any, ...], per_call_ms: float) -> float:
    """ms per call of ``n`` calls queued back to back, timed by two CUDA events (host
    overhead overlaps the GPU's work here, unlike in the synchronized median)."""
    n = max(10, min(200, int(200 / max(per_call_ms, 1e-3))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        impl(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


# -- one implementation of one workload, in process ------------------------------------------------


def measure_impl(
    name: str, fn: Any, args: tuple[Any, ...], ref: Any, device: str, budget_s: float, min_reps: int
) -> tuple[dict[str, Any], str]:
    """Build, first call (timed, compile included), two warm-up calls, then the median of
    synchronized calls; peak GPU memory above what was allocated before. Returns
    (info, correctness)."""
    cuda = device == "cuda"
    sync = _sync_fn(device)
    info: dict[str, Any] = {}
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            impl = make_impl(name, fn)
            sync()
            t0 = time.perf_counter()
            out = impl(*args)
            sync()
            info["first_call_s"] = time.perf_counter() - t0
            # every output is checked at once (reduce-overhead's are overwritten by the next
            # call); calls 2 and 3 cover Cuvil's graph capture and first replay
            states = [check(out, ref) if name != "eager" else "ok"]
            for _ in range(2):
                out = impl(*args)
                sync()
                states.append(check(out, ref) if name != "eager" else "ok")
            del out
        correct = next((s for s in states if s != "ok"), "ok")
        if caught:
            info["warnings"] = sorted({str(w.message).splitlines()[0][:300] for w in caught})
        if name.startswith("cuvil"):
            st = impl.stats
            info["stats"] = {
                "compiles": st.compiles,
                "cache_hits": st.cache_hits,
                "fallbacks": st.fallbacks,
                "fallback_reasons": list(st.fallback_reasons),
                "notes": list(getattr(st, "notes", [])),
            }
            if st.fallbacks:
                reason = st.fallback_reasons[0] if st.fallback_reasons else "?"
                correct = f"FALLBACK to eager ({reason.splitlines()[0][:200]})"

        def synced(*a: Any) -> Any:
            result = impl(*a)
            sync()
            return result

        info.update(time_round_robin({name: synced}, args, budget_s, min_reps)[name])
        if cuda:
            info["back_to_back_ms"] = back_to_back_ms(impl, args, info["median_ms"])
            info["peak_mb"] = _mb(torch.cuda.max_memory_allocated() - base)
            info["held_mb"] = _mb(torch.cuda.memory_allocated() - base)
        impl = None  # free it before the next implementation
    except Exception as exc:
        info["error"] = short_error(exc)
        info["traceback"] = traceback.format_exc()[-3000:]
        correct = f"error ({info['error']})"
        log(f"  {name}: {info['error']}")
    return info, correct


# -- child processes: Cuvil's cold and warm first call ---------------------------------------------------


def _child_env(cache_dir: str) -> dict[str, str]:
    """Every compile cache in ``cache_dir``: Cuvil's programs and autotuning, Triton's
    kernels (Cuvil's launches JIT-compile through Triton), inductor's."""
    return {**cache_env("torch_compile", cache_dir), **cache_env("cuvil", cache_dir)}


def child_main(workload: str, size: int, smoke: bool) -> None:
    """In a fresh process: CUDA initialised and Cuvil's one-time imports done, then time the
    first call of ``cu.compile(fn, target="cuda")`` (compile, Triton, autotuning, the
    first launch), three steady calls; print one JSON line."""
    device = "cpu" if smoke else "cuda"
    sync = _sync_fn(device)
    result: dict[str, Any] = {"workload": workload, "size": size}
    try:
        if device == "cuda":
            t0 = time.perf_counter()
            torch.zeros(1, device="cuda")
            sync()
            result["cuda_init_s"] = time.perf_counter() - t0
        import cuvil as cu

        result["import_s"] = cu.warmup()
        fn, args = build_on(WORKLOADS[workload], size, device)
        f = cu.compile(fn, target="cuda")
        sync()
        t0 = time.perf_counter()
        f(*args)
        sync()
        result["first_call_s"] = time.perf_counter() - t0
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f(*args)
            sync()
            times.append(time.perf_counter() - t0)
        result["steady_ms"] = sorted(times)[1] * 1e3
        result["compiles"] = f.stats.compiles
        result["fallbacks"] = f.stats.fallbacks
        result["fallback_reasons"] = list(f.stats.fallback_reasons)
        if device == "cuda":
            result["peak_mb"] = _mb(torch.cuda.max_memory_allocated())
    except Exception as exc:
        result["error"] = short_error(exc)
        result["traceback"] = traceback.format_exc()[-3000:]
    print(json.dumps(result), flush=True)


def run_child(workload: str, size: int, smoke: bool, cache_dir: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.gpu", "--child", workload, "--size", str(size)]
    cmd += ["--cache-dir", cache_dir] + (["--smoke"] if smoke else [])
    return run_json_child(cmd, dict(os.environ, **_child_env(cache_dir)), timeout)


# -- per-call overhead at batch 1 --------------------------------------------------------------


def measure_percall(device: str, budget: Budget, quick: bool, smoke: bool) -> list[dict[str, Any]]:
    """Microseconds per call on tiny inputs (as ``benchmarks.percall``): back to back
    (host overhead, the GPU keeps up) and synchronized after each call (latency)."""
    sync = _sync_fn(device)
    torch.manual_seed(0)
    x, y = torch.randn(4, device=device), torch.randn(4, device=device)
    bert = _prepare(BertEncoderLayer(d=64, heads=2, ffn=128)).to(device)
    h = torch.randn(1, 4, 64, device=device)
    calls, repeats = (40, 3) if smoke else (500, 3) if quick else (2000, 5)
    cases = [
        ("tiny graph: x + y, 4 elements", lambda x, y: x + y, (x, y), calls),
        ("BERT-like layer, batch 1, seq 4, d 64", bert, (h,), max(calls // 5, 5)),
    ]
    rows = []
    for case, fn, args, n in cases:
        ref = fn(*args)
        entry: dict[str, Any] = {"case": case, "calls": n, "repeats": repeats, "impls": {}}
        rows.append(entry)
        for name in IMPLS:
            if not budget.allows(f"per-call `{case}` {IMPLS[name]}", NEED_S[name], reserve=False):
                entry["impls"][name] = {"skipped": "time budget"}
                continue
            info: dict[str, Any] = {}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    impl = make_impl(name, fn)
                    for _ in range(3):
                        out = impl(*args)
                        sync()
                        state = check(out, ref)
                        if state != "ok":
                            info["correct"] = state
                    del out

                    def synced(*a: Any, impl: Any = impl) -> Any:
                        result = impl(*a)
                        sync()
                        return result

                    info["back_to_back_us"] = percall.measure(impl, args, n, repeats)
                    sync()
                    info["synchronized_us"] = percall.measure(synced, args, n, repeats)
                if name.startswith("cuvil") and impl.stats.fallbacks:
                    info["correct"] = "FALLBACK to eager"
                impl = None  # free it before the next implementation
            except Exception as exc:
                info["error"] = short_error(exc)
                info["traceback"] = traceback.format_exc()[-3000:]
                log(f"  per-call {case} {name}: {info['error']}")
            entry["impls"][name] = info
            if "synchronized_us" in info:
                log(
                    f"  per-call {case[:30]:<30} {IMPLS[name]:<30} "
                    f"{info['back_to_back_us']:8.1f} us back to back, {info['synchronized_us']:8.1f} us synchronized"
                )
    return rows


# -- machine ---------------------------------------------------------------------------------


def describe_gpu(device: str) -> dict[str, Any]:
    m = describe_machine(torch.get_num_threads())
    try:
        import triton

        m["triton"] = triton.__version__
    except Exception as exc:
        m["triton"] = f"not importable ({short_error(exc)})"
    m["cuda_runtime"] = torch.version.cuda or "none (CPU build of torch)"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        m["gpu"] = props.name
        m["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        m["compute_capability"] = f"{props.major}.{props.minor}"
        smi = _cmd("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").strip()
        m["driver"] = smi.splitlines()[0] if smi else "?"
        m["cudnn"] = torch.backends.cudnn.version()
        m["tf32"] = {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
        }
    else:
        m["gpu"] = "none: --smoke (CPU tensors, Triton interpreter)"
    return m


# -- report --------------------------------------------------------------------------------


COLUMNS = [
    "workload",
    "input",
    "eager ms",
    "tc ms",
    "tc r-o ms",
    "cuvil ms",
    "cuvil no-graphs ms",
    "x vs eager",
    "x vs tc",
    "x vs tc r-o",
    "cuvil cold s",
    "cuvil warm s",
    "first call s (tc/cuvil)",
    "peak MB (eager/tc/r-o/cuvil/no-graphs)",
    "correct",
]


def _cell_ms(entry: dict[str, Any], impl: str) -> str:
    info = entry.get("impls", {}).get(impl)
    if info is None:
        return "-"
    if "skipped" in info:
        return "skipped"
    if "error" in info:
        return "error"
    text = report._fmt_ms(info.get("median_ms"))
    return text if entry.get("correct", {}).get(impl) == "ok" else f"({text})"


def _cell_x(entry: dict[str, Any], base: str, impl: str = "cuvil") -> str:
    valid = report._ok(entry, impl) and report._ok(entry, base)
    return report._fmt_x(report.ratio(entry, base, impl), valid)


def _cell_child(child: dict[str, Any] | None) -> str:
    if not child:
        return "-"
    if "skipped" in child:
        return "skipped"
    return report._fmt_s(child)


def _first_calls(entry: dict[str, Any]) -> str:
    vals = []
    for impl in ("torch_compile", "cuvil"):
        v = entry.get("impls", {}).get(impl, {}).get("first_call_s")
        vals.append("-" if v is None else f"{v:.1f}")
    return "/".join(vals)


def _peaks(entry: dict[str, Any]) -> str:
    vals = []
    for impl in IMPLS:
        v = entry.get("impls", {}).get(impl, {}).get("peak_mb")
        vals.append("-" if v is None else f"{v:.0f}")
    return "-" if all(v == "-" for v in vals) else "/".join(vals)


def _correct(entry: dict[str, Any]) -> str:
    problems = []
    short = {
        "torch_compile": "tc",
        "torch_compile_ro": "tc r-o",
        "cuvil": "cuvil",
        "cuvil_nograph": "no-graphs",
    }
    for impl, label in short.items():
        state = entry.get("correct", {}).get(impl, "not run")
        if state not in ("ok", "skipped", "not run"):
            problems.append(f"{label}: {state if len(state) <= 100 else state[:97] + '...'}")
    return ("; ".join(problems) or "yes").replace("|", "\\|")


def row(entry: dict[str, Any]) -> list[str]:
    children = entry.get("children", {})
    return [
        entry["name"],
        entry.get("input", "?"),
        *(
            _cell_ms(entry, impl)
            for impl in ("eager", "torch_compile", "torch_compile_ro", "cuvil", "cuvil_nograph")
        ),
        _cell_x(entry, "eager"),
        _cell_x(entry, "torch_compile"),
        _cell_x(entry, "torch_compile_ro"),
        _cell_child(children.get("cuvil_cold")),
        _cell_child(children.get("cuvil_warm")),
        _first_calls(entry),
        _peaks(entry),
        _correct(entry),
    ]


SUMMARY_PAIRS = {
    "cuvil_vs_eager": ("eager", "cuvil"),
    "cuvil_vs_torch_compile": ("torch_compile", "cuvil"),
    "cuvil_vs_torch_compile_ro": ("torch_compile_ro", "cuvil"),
    "cuvil_nograph_vs_eager": ("eager", "cuvil_nograph"),
    "cuvil_nograph_vs_torch_compile": ("torch_compile", "cuvil_nograph"),
    "graphs_vs_nograph": ("cuvil_nograph", "cuvil"),
    "torch_compile_vs_eager": ("eager", "torch_compile"),
    "torch_compile_ro_vs_eager": ("eager", "torch_compile_ro"),
}


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric means of base ms / impl ms over the workloads where both are correct."""
    out = {}
    for key, (base, impl) in SUMMARY_PAIRS.items():
        values = [
            r
            for e in results
            if report._ok(e, base) and report._ok(e, impl) and (r := report.ratio(e, base, impl)) is not None
        ]
        out[key] = {"geomean": report.geomean(values), "n": len(values)}
    return out


def render_markdown(data: dict[str, Any]) -> str:
    m, cfg = data.get("machine", {}), data.get("config", {})
    results = data.get("results", [])
    smoke = cfg.get("smoke")
    gpu = m.get("gpu", "?")
    if "gpu_memory_gb" in m:
        gpu += f" ({m['gpu_memory_gb']} GB, compute capability {m.get('compute_capability', '?')})"
    lines = [
        "# Cuvil GPU benchmark"
        + (" (SMOKE RUN: CPU tensors, Triton interpreter; times are meaningless)" if smoke else ""),
        "",
        f"- date: {m.get('date', '?')}; commit {m.get('git_commit', '?')}",
        f"- GPU: {gpu}; driver {m.get('driver', '-')}; CUDA (torch build) {m.get('cuda_runtime', '?')}; cuDNN {m.get('cudnn', '-')}",
        f"- torch {m.get('torch', '?')}; triton {m.get('triton', '?')}; cuvil {m.get('cuvil', '?')}; Python {m.get('python', '?')}",
        f"- host: {m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs; {m.get('os', '?')}",
    ]
    if m.get("tf32"):
        lines.append(
            f"- TF32 (torch defaults, left as they are): matmul {m['tf32']['matmul']}, cuDNN convolutions {m['tf32']['cudnn']}"
        )
    lines += [
        f"- time budget {cfg.get('budget_s', '?'):.0f} s (reserve {cfg.get('reserve_s', 0):.0f} s for the per-call section); "
        f"this run took {data.get('wall_s', 0):.0f} s" + ("; **quick run**" if cfg.get("quick") else ""),
        f"- command: `{cfg.get('command', '?')}`",
        f"- dtype: {cfg.get('dtype', 'float32')}"
        + (
            " (modules .to(dtype), float32 inputs cast; outputs checked within the conformance kit's "
            "half tolerance; workloads that cannot run in it left out)"
            if cfg.get("dtype", "float32") != "float32"
            else ""
        ),
    ]
    if smoke:
        lines.append(
            "- smoke: the `cuda` target took CPU tensors under `TRITON_INTERPRET=1`; CUDA Graphs are not used "
            "(so `cuvil` and `cuvil no-graphs` run the same way), CUDA-event (back-to-back) timing and GPU memory "
            "are skipped; torch.compile compiled for the CPU."
        )
    lines += [
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i in (0, 1, len(COLUMNS) - 1) else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(row(e)) + " |" for e in results]
    s = summary(results)

    def g(key: str) -> str:
        v = s[key]
        return f"{v['geomean']:.2f}x (n={v['n']})" if v["geomean"] else f"- (n={v['n']})"

    lines += [
        "",
        "Geometric means of speedups (workloads where both outputs match eager): "
        f"cuvil vs eager {g('cuvil_vs_eager')}, vs torch.compile {g('cuvil_vs_torch_compile')}, "
        f"vs torch.compile reduce-overhead {g('cuvil_vs_torch_compile_ro')}; "
        f"cuvil no-graphs vs eager {g('cuvil_nograph_vs_eager')}, vs torch.compile {g('cuvil_nograph_vs_torch_compile')}; "
        f"CUDA Graphs on vs off {g('graphs_vs_nograph')}; "
        f"torch.compile vs eager {g('torch_compile_vs_eager')}, reduce-overhead vs eager {g('torch_compile_ro_vs_eager')}.",
        "",
        "ms: median of calls each followed by `torch.cuda.synchronize()` (the GPU idle before every call: "
        "latency, host overhead included), after a first call and two warm-up calls; each implementation is "
        'timed alone. `cuvil ms` is `target="cuda"` with CUDA Graphs, `x vs ...` = that ms / cuvil ms '
        "(above 1: Cuvil is faster; in parentheses when an output did not match). Cold / warm: the first "
        "call in a fresh child process (CUDA initialised, `cu.warmup()` done) with empty / filled "
        "`CUVIL_CACHE_DIR` and `TRITON_CACHE_DIR`. First call: in this process, compile included (fresh "
        "caches at process start). Peak MB: `torch.cuda.max_memory_allocated()` above what was allocated "
        "before the implementation was built (weights, inputs), reset per implementation. "
        "JSON: also back-to-back ms (CUDA events around up to 200 queued calls), min/p90, warnings, Cuvil stats. "
        'See benchmarks/README.md, "GPU run".',
        "",
        "## Workloads",
        "",
    ]
    for e in results:
        lines.append(
            f"- `{e['name']}` ({e.get('kind', '?')}), input {e.get('input', '?')}: {e.get('description', '')}"
        )
    pc = data.get("percall")
    if pc:
        lines += [
            "",
            "## Per-call overhead (batch 1)",
            "",
            "Microseconds per call, median of blocks of calls (`benchmarks.percall.measure`): back to back "
            "(no synchronization: what the host spends per call while the GPU keeps up) / synchronized after "
            "every call (latency).",
            "",
            "| case | " + " | ".join(f"{label} us" for label in IMPLS.values()) + " |",
            "|---|" + "---:|" * len(IMPLS),
        ]
        for entry in pc:
            cells = []
            for name in IMPLS:
                info = entry["impls"].get(name, {})
                if "skipped" in info:
                    cells.append("skipped")
                elif "error" in info:
                    cells.append("error")
                elif "synchronized_us" in info:
                    text = f"{info['back_to_back_us']:.1f} / {info['synchronized_us']:.1f}"
                    cells.append(text if "correct" not in info else f"({text}) mismatch")
                else:
                    cells.append("-")
            lines.append(f"| {entry['case']} | " + " | ".join(cells) + " |")
    notes = _notes(data)
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def _notes(data: dict[str, Any]) -> list[str]:
    notes = [f"- {s}" for s in data.get("skipped", [])]
    for entry in data.get("results", []):
        name = entry["name"]
        for impl, info in entry.get("impls", {}).items():
            if "error" in info:
                notes.append(f"- `{name}` {IMPLS[impl]}: {info['error']}")
            for note in info.get("stats", {}).get("notes", []):
                notes.append(f"- `{name}` {IMPLS[impl]}: {note}")
            for reason in info.get("stats", {}).get("fallback_reasons", []):
                notes.append(f"- `{name}` {IMPLS[impl]} fell back to eager: {reason.splitlines()[0][:300]}")
        for key, child in entry.get("children", {}).items():
            if "error" in child:
                notes.append(f"- `{name}` child {key}: {child['error']}")
    for entry in data.get("percall", []):
        for impl, info in entry["impls"].items():
            if "error" in info:
                notes.append(f"- per-call `{entry['case']}` {IMPLS[impl]}: {info['error']}")
            if "correct" in info:
                notes.append(f"- per-call `{entry['case']}` {IMPLS[impl]}: {info['correct']}")
    return [n.replace("\n", " ") for n in dict.fromkeys(notes)]


def write_report(data: dict[str, Any], out_dir: Path) -> list[Path]:
    data["wall_s"] = time.perf_counter() - _T0
    data["summary"] = summary(data.get("results", []))
    dtype = bench_dtype()  # a half-precision run keeps its own files beside the float32 one's
    stem = "gpu_latest" if dtype is None else f"gpu_{str(dtype).removeprefix('torch.')}_latest"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(data, indent=2, default=str))
    paths[1].write_text(render_markdown(data))
    return paths


# -- main -------------------------------------------------------------------------------------------


def _input_text(args: tuple[Any, ...]) -> str:
    return ", ".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))


def run(args: argparse.Namespace, argv: list[str]) -> int:
    device = "cpu" if args.smoke else "cuda"
    budget_s = args.budget or (100.0 if args.quick else 420.0)
    budget = Budget(budget_s, reserve_s=25.0 if args.quick else 40.0)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workloads = select(args.workloads)
    sizes = SMOKE_SIZES if args.smoke else GPU_SIZES
    timing = (0.05, 3) if args.smoke else (0.1, 5) if args.quick else (0.4, 20)
    children = not (args.quick or args.no_children)

    # fresh compile caches for this process (first calls are cold ones), removed at the end
    tmp = tempfile.mkdtemp(prefix="cuvil-gpubench-")
    os.environ.update(_child_env(tmp))
    import cuvil as cu

    import_s = cu.warmup()  # the one-time imports of capture, before anything is timed
    data: dict[str, Any] = {
        "machine": describe_gpu(device),
        "config": {
            "device": device,
            "smoke": args.smoke,
            "quick": args.quick,
            "budget_s": budget_s,
            "reserve_s": budget.reserve_s,
            "children": children,
            "timing_budget_s": timing[0],
            "min_reps": timing[1],
            "sizes": {wl.name: sizes.get(wl.name, wl.default_size) for wl in workloads},
            "dtype": args.dtype or "float32",
            "cuvil_import_s": import_s,
            "command": " ".join(["python -m benchmarks.gpu", *argv]),
        },
        "results": [],
        "skipped": budget.skipped,
    }
    m = data["machine"]
    log(f"{m['gpu']}; torch {m['torch']}, triton {m['triton']}, cuvil {m['cuvil']}; budget {budget_s:.0f} s")

    def hard_stop(signum: int, frame: Any) -> None:
        raise OutOfTime(f"hard stop: {budget_s:.0f} s budget + 40 s passed")

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, hard_stop)
        signal.alarm(int(budget.deadline - time.perf_counter() + 40) + 1)
    try:
        entries = {}
        # phase 1: eager, Cuvil (graphs on, off), torch.compile, every workload
        for wl in workloads:
            size = sizes.get(wl.name, wl.default_size)
            fn, inputs = build_on(wl, size, device)
            entry: dict[str, Any] = {
                "name": wl.name,
                "kind": wl.kind,
                "description": wl.description,
                "size": size,
                "input": _input_text(inputs),
                "impls": {},
                "correct": {},
            }
            entries[wl.name] = entry
            data["results"].append(entry)
            log(f"{wl.name} ({entry['input']}): eager, cuvil, cuvil no-graphs, torch.compile")
            ref = fn(*inputs)
            for name in CORE_IMPLS:
                if not budget.allows(f"`{wl.name}` {IMPLS[name]}", NEED_S[name]):
                    entry["impls"][name], entry["correct"][name] = {"skipped": "time budget"}, "skipped"
                    continue
                info, entry["correct"][name] = measure_impl(name, fn, inputs, ref, device, *timing)
                entry["impls"][name] = info
                if "median_ms" in info:
                    log(f"  {IMPLS[name]:<30} median {info['median_ms']:9.3f} ms over {info['reps']} calls")
                write_report(data, out_dir)
            del fn, inputs, ref
        # phase 2: Cuvil's cold and warm first call, in child processes
        for wl in workloads if children else []:
            entry = entries[wl.name]
            entry["children"] = {}
            first = entry["impls"].get("cuvil", {}).get("first_call_s", 20.0)
            cache_dir = tempfile.mkdtemp(prefix="child-", dir=tmp)  # cold: empty; warm: what cold left
            for key, need in (("cuvil_cold", first + 10), ("cuvil_warm", 10)):
                if key == "cuvil_warm" and "first_call_s" not in entry["children"]["cuvil_cold"]:
                    entry["children"][key] = {"skipped": "no cold run"}
                    continue
                if not budget.allows(f"`{wl.name}` {key} child", need):
                    entry["children"][key] = {"skipped": "time budget"}
                    continue
                log(f"{wl.name}: {key} child")
                child = run_child(wl.name, entry["size"], args.smoke, cache_dir, max(10, budget.left() + 30))
                entry["children"][key] = child
                if "error" in child:
                    log(f"  {key} ERROR {child['error']}")
                else:
                    log(f"  {key} first call {child['first_call_s']:.2f} s")
                write_report(data, out_dir)
            shutil.rmtree(cache_dir, ignore_errors=True)
        # phase 3: torch.compile mode="reduce-overhead" (CUDA Graphs), if time is left
        for wl in workloads:
            entry = entries[wl.name]
            tc_first = entry["impls"].get("torch_compile", {}).get("first_call_s", 20.0)
            if not budget.allows(
                f"`{wl.name}` {IMPLS['torch_compile_ro']}", max(NEED_S["torch_compile_ro"], 0.7 * tc_first)
            ):
                entry["impls"]["torch_compile_ro"], entry["correct"]["torch_compile_ro"] = (
                    {"skipped": "time budget"},
                    "skipped",
                )
                continue
            log(f"{wl.name}: torch.compile reduce-overhead")
            fn, inputs = build_on(wl, entry["size"], device)
            info, entry["correct"]["torch_compile_ro"] = measure_impl(
                "torch_compile_ro", fn, inputs, fn(*inputs), device, *timing
            )
            entry["impls"]["torch_compile_ro"] = info
            if "median_ms" in info:
                log(
                    f"  {IMPLS['torch_compile_ro']:<30} median {info['median_ms']:9.3f} ms over {info['reps']} calls"
                )
            write_report(data, out_dir)
            del fn, inputs
        # phase 4: per-call overhead at batch 1 (the reserve is its time)
        log("per-call overhead, batch 1")
        data["percall"] = measure_percall(device, budget, args.quick, args.smoke)
    except OutOfTime as exc:
        budget.skipped.append(f"{exc}: the run stopped where it was")
        log(str(exc))
    finally:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)
        shutil.rmtree(tmp, ignore_errors=True)
    paths = write_report(data, out_dir)
    print()
    print(paths[1].read_text())
    log(f"wrote {', '.join(map(str, paths))} in {data['wall_s']:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default="all", help="comma-separated names (default: all)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="~1.5 min: short timings, no cold/warm children")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="no GPU: CPU tensors, tiny shapes, Triton interpreter (TRITON_INTERPRET=1)",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for the whole run (default 420; --quick 100)"
    )
    parser.add_argument("--no-children", action="store_true", help="no cold/warm child processes")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16"),
        default=None,
        help="run every workload in this dtype (modules .to(dtype), float32 inputs cast; outputs "
        "checked within the conformance kit's half tolerance); results in gpu_<dtype>_latest.*",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.dtype is not None:
        os.environ[DTYPE_ENV] = args.dtype  # the workloads read it when built; children inherit it
    interpret = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    if args.child:
        os.environ.update(_child_env(args.cache_dir) if args.cache_dir else {})
        child_main(args.child, args.size, args.smoke)
        return 0
    if args.smoke and not interpret:
        print(
            "benchmarks.gpu --smoke needs TRITON_INTERPRET=1 in the environment before Python starts "
            "(the cuda target then runs its kernels in Triton's interpreter on CPU tensors)",
            file=sys.stderr,
        )
        return 2
    if not args.smoke:
        if not torch.cuda.is_available():
            print(
                f"benchmarks.gpu: no CUDA GPU visible (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda or 'none: a CPU-only build'}). Run it on a GPU machine (benchmarks/gpu.sh), "
                "or check the harness here: TRITON_INTERPRET=1 python -m benchmarks.gpu --smoke --workloads head",
                file=sys.stderr,
            )
            return 2
        if interpret:
            print("benchmarks.gpu: unset TRITON_INTERPRET for a GPU run (or pass --smoke)", file=sys.stderr)
            return 2
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
