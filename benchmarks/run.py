"""Benchmark eager PyTorch, torch.compile (inductor, default settings) and Cuvil on
the workloads of ``benchmarks/workloads.py``.

    python -m benchmarks.run                          every workload, Cuvil target cpu
    python -m benchmarks.run --quick --workloads head  a smoke run
    python -m benchmarks.run --isa avx2                Cuvil's kernels built for AVX2 (CUVIL_CPU_ISA)
    nox -s bench -- --workloads gelu_mlp,head          the same through nox

Writes ``<out>/latest.md`` (table), ``<out>/latest.json`` (raw numbers) and
``<out>/latest.png`` (speedup chart, when matplotlib is installed). What each
column means, how cold/warm compile times and the roofline (``benchmarks/roofline.py``:
copy-bound and GEMM-bound time per workload) are measured: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks import report, roofline
from benchmarks.measure_one import EXTRA_IMPLS, IMPLS, build_impl, cache_env, tc_graph_breaks, tc_graph_count
from benchmarks.workloads import DTYPE_ENV, Workload, bench_dtype, select

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
RTOL = ATOL = 1e-3


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# -- machine -----------------------------------------------------------------------------------


def _cmd(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine(threads: int) -> dict[str, Any]:
    lscpu = {}
    for line in _cmd("lscpu").splitlines():
        key, _, value = line.partition(":")
        lscpu[key.strip()] = value.strip()
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        cuvil_version = version("cuvil")
    except Exception:
        cuvil_version = "?"
    gcc = _cmd("gcc", "--version").splitlines()
    commit = _cmd("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD").strip()
    return {
        "cpu": lscpu.get("Model name") or platform.processor() or "?",
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical,
        "sockets": lscpu.get("Socket(s)"),
        "cores_per_socket": lscpu.get("Core(s) per socket"),
        "threads_used": threads,
        "torch": torch.__version__,
        "cuvil": cuvil_version,
        "python": platform.python_version(),
        "gcc": gcc[0] if gcc else "not found",
        "os": platform.platform(),
        "git_commit": commit or "?",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# -- in-process steady state -----------------------------------------------------------------------


def _max_abs_err(out: Any, ref: Any) -> float | None:
    try:
        a = torch.as_tensor(out).double()
        b = torch.as_tensor(ref).double()
        finite = torch.isfinite(b)
        return float((a - b)[finite].abs().max()) if finite.any() else 0.0
    except Exception:
        return None


def tolerance() -> tuple[float, float]:
    """``(rtol, atol)`` of the output check: :data:`RTOL`/:data:`ATOL` for float32, the
    conformance kit's for a half-precision run (``--dtype``: [Note: half-precision tolerances])."""
    dtype = bench_dtype()
    if dtype in (torch.bfloat16, torch.float16):
        from cuvil.testing.conformance import TOLERANCES

        return TOLERANCES[dtype]["rtol"], TOLERANCES[dtype]["atol"]
    return RTOL, ATOL


def check(out: Any, ref: Any) -> str:
    """``"ok"``, or why ``out`` does not match the eager result."""
    rtol, atol = tolerance()
    try:
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
        return "ok"
    except AssertionError as exc:
        err = _max_abs_err(out, ref)
        detail = f"max abs err {err:.2e}" if err is not None else short_error(exc)
        return f"mismatch ({detail})"
    except Exception as exc:
        return f"mismatch ({short_error(exc)})"


#: target length of one implementation's block of back-to-back calls in a round
BLOCK_S = 0.02


def time_round_robin(
    impls: dict[str, Any], args: tuple[Any, ...], budget_s: float, min_reps: int
) -> dict[str, dict[str, Any]]:
    """Median time per call of each implementation, interleaved round-robin.

    Each implementation gets enough calls for about ``budget_s`` seconds (at least
    ``min_reps``). The calls run in rounds: in each round every implementation that
    still owes calls makes one block of them back to back (a block lasts about
    ``BLOCK_S``, at least one call), and the order rotates from round to round. So
    a slow spell on a shared machine hits every implementation alike.
    """
    names = list(impls)
    per_call = {}
    for name in names:  # estimate after warm-up: the median of 3 calls
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            impls[name](*args)
            samples.append(time.perf_counter() - t0)
        per_call[name] = max(sorted(samples)[1], 1e-6)
    reps = {n: max(min_reps, min(20000, math.ceil(budget_s / per_call[n]))) for n in names}
    block = {n: max(1, min(reps[n], int(BLOCK_S / per_call[n]))) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    r = 0
    gc.collect()
    while any(len(times[n]) < reps[n] for n in names):
        order = names[r % len(names) :] + names[: r % len(names)]
        r += 1
        for name in order:
            fn, done = impls[name], times[name]
            for _ in range(min(block[name], reps[name] - len(done))):
                t0 = time.perf_counter()
                fn(*args)
                done.append(time.perf_counter() - t0)
    out = {}
    for name in names:
        ts = sorted(times[name])
        out[name] = {
            "median_ms": ts[len(ts) // 2] * 1e3,
            "min_ms": ts[0] * 1e3,
            "p90_ms": ts[min(len(ts) - 1, int(len(ts) * 0.9))] * 1e3,
            "reps": len(ts),
            "rounds": r,
        }
    return out


def measure_in_process(
    wl: Workload, target: str, quick: bool, machine_rates: dict[str, Any] | None = None
) -> dict[str, Any]:
    fn, args = wl.build()
    ref = fn(*args)
    bound: dict[str, Any] | None = None
    if machine_rates is not None:
        try:
            cost = roofline.workload_cost(fn, args)
            bound = {**cost, **roofline.bound(cost, machine_rates)}
        except Exception as exc:
            bound = {"error": short_error(exc)}
    impls: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {name: {} for name in (*IMPLS, *EXTRA_IMPLS)}
    correct: dict[str, str] = {}
    for name in (*IMPLS, *EXTRA_IMPLS):
        if name == "torch_compile":
            torch._dynamo.reset()  # no cached graphs (or automatic-dynamic marks) from earlier workloads
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if name == "onnxruntime":
                    from benchmarks.ort import build_ort

                    impl = build_ort(fn, args, threads=torch.get_num_threads())
                else:
                    impl = build_impl(name, fn, target)
                t0 = time.perf_counter()
                out = impl(*args)
                info[name]["first_call_s"] = time.perf_counter() - t0
                for _ in range(2):  # warm-up
                    impl(*args)
        except Exception as exc:
            info[name]["error"] = short_error(exc)
            correct[name] = f"error ({short_error(exc)})"
            log(f"  {name}: {info[name]['error']}")
            continue
        if caught:
            info[name]["warnings"] = sorted({str(w.message).splitlines()[0][:300] for w in caught})
        correct[name] = check(out, ref) if name != "eager" else "ok"
        if name == "cuvil":
            stats = impl.stats
            info[name]["stats"] = {
                "compiles": stats.compiles,
                "cache_hits": stats.cache_hits,
                "fallbacks": stats.fallbacks,
                "fallback_reasons": list(stats.fallback_reasons),
            }
            if stats.fallbacks:
                reason = stats.fallback_reasons[0] if stats.fallback_reasons else "?"
                correct[name] = f"FALLBACK to eager ({reason.splitlines()[0][:200]})"
        impls[name] = impl
    budget, min_reps = (0.2, 3) if quick else (1.0, 10)
    timed_impls = dict(impls)
    if impls and bound is not None and bound.get("kind") == "copy":
        # the copy bound: a same-size copy timed in the same round-robin as the implementations
        timed_impls[COPY] = roofline.same_size_copy(bound)
    elif impls and bound is not None and bound.get("kind") == "gemm":
        # the GEMM bound: the SGEMM rate measured in the same round-robin
        timed_impls[SGEMM] = roofline.sgemm_call(roofline.GEMM_N)
    timed = time_round_robin(timed_impls, args, budget, min_reps) if impls else {}
    for name, t in timed.items():
        if name == COPY:
            assert bound is not None
            bound["copy_ms"] = t["median_ms"]
            bound["bound_ms"] = max(t["median_ms"], bound["gemm_ms"])
            continue
        if name == SGEMM:
            assert bound is not None
            gflops = 2 * roofline.GEMM_N**3 / (t["median_ms"] * 1e-3) / 1e9
            bound["sgemm_gflops"] = gflops
            bound["gemm_ms"] = bound["flops"] / (gflops * 1e9) * 1e3
            bound["bound_ms"] = max(bound["gemm_ms"], bound["copy_est_ms"])
            bound["kind"] = "gemm" if bound["gemm_ms"] >= bound["copy_est_ms"] else "copy"
            continue
        info[name].update(t)
    out: dict[str, Any] = {"impls": info, "correct": correct}
    if bound is not None:
        for name in info:
            if "median_ms" in info[name] and bound.get("bound_ms"):
                bound[f"{name}_x_bound"] = info[name]["median_ms"] / bound["bound_ms"]
        out["roofline"] = bound
    return out


#: the round-robin names of the same-size copy of a copy-bound workload and the SGEMM of a
#: GEMM-bound one (references timed with the implementations, not implementations)
COPY = "__copy__"
SGEMM = "__sgemm__"


# -- recompiles over a size sweep ------------------------------------------------------------------


def measure_sweep(wl: Workload, target: str) -> dict[str, Any]:
    """Call a fresh Cuvil callable and a fresh torch.compile callable at every size of
    the sweep; count Cuvil's compiles (``stats.compiles``) and the graphs Dynamo
    compiled (``counters["stats"]["unique_graphs"]``)."""
    fn = wl.build_fn()
    inputs = [wl.inputs(size) for size in wl.sweep]
    result: dict[str, Any] = {"axis": wl.sweep_axis, "sizes": list(wl.sweep)}
    try:
        f = build_impl("cuvil", fn, target)
        for args in inputs:
            f(*args)
        result["cuvil_compiles"] = f.stats.compiles
        result["cuvil_fallbacks"] = f.stats.fallbacks
        result["cuvil_recompile_reasons"] = [r.splitlines()[0][:300] for r in f.stats.recompile_reasons]
    except Exception as exc:
        result["cuvil_error"] = short_error(exc)
    try:
        torch._dynamo.reset()
        before, breaks_before = tc_graph_count(), tc_graph_breaks()
        g = build_impl("torch_compile", fn, target)
        for args in inputs:
            g(*args)
        result["tc_compiles"] = tc_graph_count() - before
        result["tc_graph_breaks"] = tc_graph_breaks() - breaks_before
    except Exception as exc:
        result["tc_error"] = short_error(exc)
    return result


# -- child processes: cold / warm first call, peak RSS ---------------------------------------------------


def run_child(
    wl: Workload, impl: str, target: str, cache_dir: str | None, threads: int, timeout: float
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.measure_one", "--workload", wl.name, "--impl", impl]
    cmd += ["--target", target, "--threads", str(threads)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **cache_env(impl, cache_dir))
    return run_json_child(cmd, env, timeout)


def run_json_child(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a measuring child process; its last JSON line, with ``process_wall_s``, or
    ``{"error": ...}``."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                break
            result["process_wall_s"] = wall
            return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"child exited {proc.returncode}: {tail[:300]}"}


def measure_children(
    wl: Workload, target: str, threads: int, with_tc: bool, timeout: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["eager"] = run_child(wl, "eager", target, None, threads, timeout)
    compilers = ["cuvil"] + (["torch_compile"] if with_tc else [])
    for impl in compilers:
        tmp = tempfile.mkdtemp(prefix=f"bench-{impl}-cache-")
        try:
            out[f"{impl}_cold"] = run_child(wl, impl, target, tmp, threads, timeout)
            out[f"{impl}_warm"] = run_child(wl, impl, target, tmp, threads, timeout)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default="all", help="comma-separated names (default: all)")
    parser.add_argument("--target", default="cpu", help="Cuvil target (default: cpu)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: ~0.2 s of timing per implementation (at least 3 calls), no torch.compile cold/warm children",
    )
    parser.add_argument(
        "--skip-compile-children",
        action="store_true",
        help="no child processes at all (no cold/warm compile times, no peak RSS)",
    )
    parser.add_argument("--skip-sweep", action="store_true", help="no recompile count over the size sweep")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads, here and in the children (default 2)"
    )
    parser.add_argument("--child-timeout", type=float, default=1800, help="seconds per child process")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="output folder")
    parser.add_argument(
        "--isa",
        choices=("native", "avx512", "avx2", "portable"),
        default=None,
        help="build Cuvil's cpu kernels for this ISA (sets CUVIL_CPU_ISA, here and in the children; "
        "default: as the environment says, else the host's own)",
    )
    parser.add_argument(
        "--skip-roofline", action="store_true", help="no copy bandwidth / SGEMM rate / per-workload bound"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="run every workload in this dtype: modules .to(dtype), float32 inputs cast (sets "
        f"{DTYPE_ENV}, here and in the children); workloads that cannot are left out",
    )
    args = parser.parse_args(argv)
    if args.isa is not None:
        os.environ["CUVIL_CPU_ISA"] = args.isa  # before any cpu target exists; children inherit it
    if args.dtype is not None:
        os.environ[DTYPE_ENV] = args.dtype  # the workloads read it when built; children inherit it

    workloads = select(args.workloads)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(args.threads)
    machine["host_isa"] = roofline.host_isa()
    machine["cuvil_isa"] = roofline.cuvil_isa() if args.target == "cpu" else None
    if machine["cuvil_isa"] and "error" in machine["cuvil_isa"]:
        log(
            f"cuvil cpu target unusable with CUVIL_CPU_ISA={machine['cuvil_isa']['requested']}: "
            f"{machine['cuvil_isa']['error']}"
        )
    data: dict[str, Any] = {
        "machine": machine,
        "config": {
            "target": args.target,
            "quick": args.quick,
            "children": not args.skip_compile_children,
            "tc_children": not (args.skip_compile_children or args.quick),
            "sweep": not args.skip_sweep,
            "isa": os.environ.get("CUVIL_CPU_ISA", "") or "native",
            "roofline": not args.skip_roofline,
            "dtype": args.dtype or "float32",
            "rtol": tolerance()[0],
            "atol": tolerance()[1],
            "command": " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
        },
        "results": [],
    }
    log(f"machine: {data['machine']['cpu']}, torch {data['machine']['torch']}, {args.threads} threads")
    rates: dict[str, Any] | None = None
    if not args.skip_roofline:
        rates = roofline.measure_machine(args.quick)
        data["roofline"] = rates
        log(
            "roofline: copy "
            + ", ".join(f"{c['bytes'] >> 20} MiB {c['gbps']:.1f} GB/s" for c in rates["copy"])
            + f"; SGEMM {rates['sgemm']['n']}^3 {rates['sgemm']['gflops']:.0f} GFLOP/s"
        )
    sweeps: dict[str, dict[str, Any]] = {}
    for wl in workloads:
        log(f"{wl.name}: steady state (eager, torch.compile, cuvil[{args.target}])")
        entry: dict[str, Any] = {
            "name": wl.name,
            "kind": wl.kind,
            "description": wl.description,
            "size": wl.default_size,
        }
        entry.update(measure_in_process(wl, args.target, args.quick, rates))
        for name, info in entry["impls"].items():
            if "median_ms" in info:
                log(f"  {name:<14} median {info['median_ms']:9.3f} ms over {info['reps']} calls")
        rl = entry.get("roofline") or {}
        if "bound_ms" in rl:
            log(
                f"  bound: {rl['kind']} {rl['bound_ms']:.3f} ms ({rl['bytes'] / MiB:.1f} MiB moved, "
                f"{rl['flops'] / 1e9:.2f} GFLOP)"
                + (f"; cuvil {rl['cuvil_x_bound']:.2f}x of it" if "cuvil_x_bound" in rl else "")
            )
        if not args.skip_sweep:
            key = wl.sweep_group or wl.name
            if key not in sweeps:
                log(f"{wl.name}: recompiles over {wl.sweep_axis} {list(wl.sweep)}")
                sweeps[key] = measure_sweep(wl, args.target)
            entry["sweep"] = sweeps[key]
            s = entry["sweep"]
            log(
                f"  compiles: cuvil {s.get('cuvil_compiles', 'error')}, torch.compile {s.get('tc_compiles', 'error')}"
            )
        if not args.skip_compile_children:
            with_tc = not args.quick
            log(
                f"{wl.name}: child processes (eager, cuvil cold/warm{', torch.compile cold/warm' if with_tc else ''})"
            )
            entry["children"] = measure_children(wl, args.target, args.threads, with_tc, args.child_timeout)
            for name, child in entry["children"].items():
                if "error" in child:
                    log(f"  {name:<19} ERROR {child['error']}")
                else:
                    log(
                        f"  {name:<19} first call {child['first_call_s']:8.3f} s, peak RSS {child['peak_rss_mb']:7.1f} MB"
                    )
        data["results"].append(entry)
        (out_dir / "latest.json").write_text(json.dumps(data, indent=2))  # partial results survive a crash
    paths = report.write_all(data, out_dir)
    print()
    print((out_dir / "latest.md").read_text())
    log("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
