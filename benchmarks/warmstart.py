"""Warm starts: the first call of a compiled function or a loaded artifact in a fresh process.

    python -m benchmarks.warmstart                          # resnet18_b1, bert_encoder; 5 processes each
    python -m benchmarks.warmstart --workloads head --repeats 3 --threads 1
    python -m benchmarks.warmstart --profile 25             # + cProfile of one first call per path

For each workload, in fresh child processes (``sys.executable -c ...``, the repo on
``PYTHONPATH``, bytecode caching on as an installed package has it):

* **cold**: ``cu.compile(m)(x)`` with an empty cache folder (capture, compile, kernels);
* **warm**: the same with the cache the cold process filled (the compiled-function path:
  the cache of captured variants, program and kernel caches);
* **load**: ``cu.load(path)(x)`` of an artifact ``cu.save`` wrote beforehand (the
  loaded-artifact path, its own cache folder, empty).

Each child times ``import cuvil`` (torch already imported, as a server has it), then the
step that makes the callable (``cu.compile``/``cu.load``), the first call and the second
call, and checks the first result against eager. Building the module and its input is
not timed. Reported: the median and minimum over ``--repeats`` processes. ``--profile N``
adds one process per path that runs the first call under cProfile (one thread) and lists
its top ``N`` entries by cumulative time. Results go to
``benchmarks/results/warmstart/latest.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "warmstart"

_CHILD = r"""
import sys, time, json
import torch
mode, name, path, nprof = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
COMPILER = ("torch._dynamo", "cuvil_ir.tensor_ir.lower", "cuvil_backend_cpu.loop_ir.schedule")
t0 = time.perf_counter()
import cuvil as cu
t1 = time.perf_counter()
from benchmarks.workloads import WORKLOADS
wl = WORKLOADS[name]
fn, args = wl.build()
import gc
gc_time = [0.0, 0, 0.0]
def _gc(phase, info):
    if phase == "start":
        gc_time[2] = time.perf_counter()
    else:
        gc_time[0] += time.perf_counter() - gc_time[2]
        gc_time[1] += info["generation"] == 2
# eager runs after the timed calls: its first call would warm oneDNN and MKL for ours
with torch.no_grad():
    if mode == "save":
        cu.save(cu.compile(fn, target="cpu", fallback="error"), path, *args)
        print(json.dumps({}))
        sys.exit(0)
    if mode.endswith("+freeze"):  # a server's gc.freeze() after its imports and model
        mode = mode.removesuffix("+freeze")
        gc.freeze()
    gc.callbacks.append(_gc)
    before = set(sys.modules)
    c2 = time.process_time()
    t2 = time.perf_counter()
    if mode == "load":
        f = cu.load(path)
    elif mode == "eager":  # the reference: eager's own first call in a fresh process
        f = fn
    else:
        f = cu.compile(fn, target="cpu", fallback="error")
    t3 = time.perf_counter()
    if nprof:
        import cProfile, io, pstats
        pr = cProfile.Profile()
        pr.enable()
    y = f(*args)
    t4 = time.perf_counter()
    c4 = time.process_time()
    gc.callbacks.remove(_gc)
    if nprof:
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(nprof)
        prof = s.getvalue()
    y2 = f(*args)
    t5 = time.perf_counter()
    ref = fn(*args)
err = float((y - ref).abs().max())
stats = getattr(f, "stats", None)
print(json.dumps({
    "import_s": t1 - t0, "make_s": t3 - t2, "first_s": t4 - t3, "second_s": t5 - t4,
    "make_first_s": t4 - t2, "make_first_cpu_s": c4 - c2, "gc_s": gc_time[0], "full_gcs": gc_time[1],
    "max_abs_err": err, "eq_second": bool(torch.equal(y, y2)),
    "warm_starts": getattr(stats, "warm_starts", None),
    # compiler modules the first call imported (capture: torch._dynamo; lowering; C generation)
    "compiler_imports": [m for m in COMPILER if m in sys.modules and m not in before],
    "imports": len(set(sys.modules) - before),
    "profile": prof if nprof else None,
}))
"""


def _child(mode: str, name: str, path: str, env: dict[str, str], nprof: int = 0) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, name, path, str(nprof)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {mode} {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def host(threads: int) -> dict[str, str]:
    import torch

    from cuvil_backend_cpu.toolchain import cpuinfo, export_toolchain, find_toolchain

    info = cpuinfo()
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "cpu": info.get("model name", platform.processor()),
        "cores": str(os.cpu_count()),
        "isa (native kernels)": find_toolchain().isa,
        "isa (artifacts)": export_toolchain().isa,
        "threads": str(threads),
        "load average at start": " ".join(f"{x:.2f}" for x in load),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def measure(names: list[str], repeats: int, threads: int, nprof: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cuvil-warmstart-") as tmp:
        base = dict(os.environ, OMP_NUM_THREADS=str(threads))
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
        for name in names:
            rows: dict[str, list[dict[str, Any]]] = {
                "eager": [],
                "cold": [],
                "warm": [],
                "load": [],
                "warm+freeze": [],
                "load+freeze": [],
            }
            art = str(Path(tmp) / f"{name}.cuvil")
            # the artifact from a cache of its own, so the load processes meet an empty one
            _child("save", name, art, dict(base, CUVIL_CACHE_DIR=str(Path(tmp) / f"{name}-save")))
            for i in range(repeats):
                rows["eager"].append(_child("eager", name, "", base))
                warm_dir = str(Path(tmp) / f"{name}-cache{i}")
                rows["cold"].append(_child("cold", name, "", dict(base, CUVIL_CACHE_DIR=warm_dir)))
                rows["warm"].append(_child("warm", name, "", dict(base, CUVIL_CACHE_DIR=warm_dir)))
                load_dir = str(Path(tmp) / f"{name}-load{i}")
                rows["load"].append(_child("load", name, art, dict(base, CUVIL_CACHE_DIR=load_dir)))
                env = dict(base, CUVIL_CACHE_DIR=warm_dir)
                rows["warm+freeze"].append(_child("warm+freeze", name, "", env))
                env = dict(base, CUVIL_CACHE_DIR=str(Path(tmp) / f"{name}-loadf{i}"))
                rows["load+freeze"].append(_child("load+freeze", name, art, env))
            profiles = {}
            if nprof:
                env1 = dict(base, OMP_NUM_THREADS="1", CUVIL_CACHE_DIR=str(Path(tmp) / f"{name}-cache0"))
                profiles["warm"] = _child("warm", name, "", env1, nprof)["profile"]
                env1["CUVIL_CACHE_DIR"] = str(Path(tmp) / f"{name}-loadp")
                profiles["load"] = _child("load", name, art, env1, nprof)["profile"]
            result[name] = {"runs": rows, "artifact_bytes": os.path.getsize(art), "profiles": profiles}
    return result


_COLS = ("import_s", "make_s", "first_s", "make_first_s", "make_first_cpu_s", "gc_s", "second_s")


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    table = []
    for name, r in result.items():
        for mode, runs in r["runs"].items():
            row: dict[str, Any] = {"workload": name, "path": mode}
            for c in _COLS:
                vals = [x[c] for x in runs]
                row[c] = (statistics.median(vals), min(vals))
            row["max_abs_err"] = max(x["max_abs_err"] for x in runs)
            row["compiler imported"] = sorted({m for x in runs for m in x["compiler_imports"]})
            row["imports"] = statistics.median(x["imports"] for x in runs)
            table.append(row)
    return table


def markdown(hostinfo: dict[str, str], result: dict[str, Any], repeats: int) -> str:
    lines = ["# Warm starts (`python -m benchmarks.warmstart`)", ""]
    lines += [f"- {k}: {v}" for k, v in hostinfo.items()]
    lines += [
        "",
        f"Fresh processes, median (min) of {repeats}, seconds. `import` is `import cuvil` after torch;",
        "`make` is `cu.compile(m)` / `cu.load(path)`; the workload's module and input are built untimed.",
        "`eager` is the module's own first call in a fresh process (what oneDNN's and MKL's first use",
        "cost any caller); eager's reference result is computed after the timed calls.",
        "",
        "`make + first` is what a server waits for before its first answer (wall, then the process's",
        "CPU time, which the host's load disturbs less: with 2 threads it adds both threads' time);",
        "`gc` is the time the cyclic collector ran inside it: a full collection of the ~210k objects",
        "that importing torch, sympy and cuvil leaves is due in a fresh process, and the first call that",
        "allocates enough Python objects runs it. `+freeze` rows call `gc.freeze()` after the imports and",
        "the model are built (what a server can do; Python's documented tool for long-lived startup",
        "objects), so that collection never walks them.",
        "",
        "`modules` is how many modules `make + first` imported, and which of capture's, lowering's",
        "and scheduling's (`torch._dynamo`, `tensor_ir.lower`, `loop_ir.schedule`). The cold path's",
        "CPU time leaves out the C compiler's processes.",
        "",
        "| workload | path | import | make | first call | make + first | make + first, CPU | gc | second call | max abs err | modules | compiler modules |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in summary(result):
        cells = [f"{row[c][0]:.3f} ({row[c][1]:.3f})" for c in _COLS]
        mods = ", ".join(row["compiler imported"]) or "none"
        lines.append(
            f"| {row['workload']} | {row['path']} | "
            + " | ".join(cells)
            + f" | {row['max_abs_err']:.1e} | {row['imports']:.0f} | {mods} |"
        )
    for name, r in result.items():
        for mode, text in r["profiles"].items():
            lines += [
                "",
                f"## First call, {name}, {mode} (cProfile, 1 thread, cumulative)",
                "",
                "```",
                text.strip(),
                "```",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="resnet18_b1,bert_encoder")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument(
        "--profile", type=int, default=0, help="cProfile's top N entries of one first call per path"
    )
    ap.add_argument("--out", default=str(OUT), help="folder for latest.md and latest.json ('' for none)")
    a = ap.parse_args(argv)
    hostinfo = host(a.threads)
    result = measure(a.workloads.split(","), a.repeats, a.threads, a.profile)
    try:
        hostinfo["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    md = markdown(hostinfo, result, a.repeats)
    print(md)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "latest.md").write_text(md)
        (out / "latest.json").write_text(json.dumps({"host": hostinfo, "result": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
