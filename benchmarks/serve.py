"""Serving: QPS of a pre-process -> model -> post-process loop, and warm starts.

    python -m benchmarks.serve                     # from the repo root, in a dev venv
    python -m benchmarks.serve --requests 400 --repeats 5 --skip-warm

**QPS** (the BERT-like encoder layer of :mod:`benchmarks.workloads`, batch 1, seq
128): each request is pre-processed in Python (words hashed to ids, an embedding
lookup), run through the model, and post-processed in Python (mean-pooled,
normalised, turned into a list of floats). Four loops, same requests, same model:

* eager, synchronous;
* torch.compile (inductor, ``dynamic=False``: one shape), synchronous and pipelined
  through the same one-thread executor;
* onnxruntime, synchronous (the seed's baseline), and pipelined through a
  one-thread ``ThreadPoolExecutor`` (its ``run`` releases the GIL too, so it can
  overlap as well: the fair comparison for ``submit``);
* Cuvil (``cpu``), synchronous, and pipelined with ``f.submit``: request *i+1* is
  pre-processed while request *i* runs.

Each loop is timed ``repeats`` times, interleaved; the median QPS is reported.

**Warm start**: in fresh child processes with a populated cache, the seconds from
``import cuvil`` finishing to the first result (``cu.compile(...)`` and the first
call, or ``cu.load`` and the first call; building the workload is not timed), for
a compiled function (the cache of captured variants: no capture, no ``ShapeEnv``)
and for a ``cu.load``-ed artifact, for the ``head`` and ``resnet18_b1`` workloads.
The children run with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` unset), as
an installed package does.
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
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.workloads import WORKLOADS

SEQ, D = 128, 256
VOCAB = 4096


def _texts(n: int) -> list[str]:
    words = "the of and to in is was for on that with as by at from his her an were are which".split()
    return [
        " ".join(words[(i * 7 + j * 3) % len(words)] + str((i + j) % 13) for j in range(SEQ))
        for i in range(n)
    ]


class Pipeline:
    """The Python work around the model, identical for every implementation."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.emb = torch.randn(VOCAB, D, generator=g) * 0.1
        self.pos = torch.randn(SEQ, D, generator=g) * 0.1

    def pre(self, text: str) -> torch.Tensor:
        ids = [zlib.crc32(w.encode()) % VOCAB for w in text.split()][:SEQ]
        ids += [0] * (SEQ - len(ids))
        return (self.emb[torch.tensor(ids)] + self.pos).unsqueeze(0)

    def post(self, y: torch.Tensor) -> list[float]:
        v = y[0].mean(0)
        v = v / v.norm()
        return [round(float(a), 4) for a in v.tolist()]


def sync_loop(
    run: Callable[[torch.Tensor], torch.Tensor], p: Pipeline, texts: list[str]
) -> list[list[float]]:
    return [p.post(run(p.pre(t))) for t in texts]


def pipelined_loop(submit: Callable[[torch.Tensor], Any], p: Pipeline, texts: list[str]) -> list[list[float]]:
    out = []
    fut = submit(p.pre(texts[0]))
    for t in texts[1:]:
        x = p.pre(t)  # overlaps with the running request
        y = fut.result()
        fut = submit(x)
        out.append(p.post(y))  # overlaps with the next one
    out.append(p.post(fut.result()))
    return out


def measure_qps(requests: int, repeats: int, threads: int) -> dict[str, Any]:
    import cuvil as cu
    from benchmarks.ort import build_ort

    torch.set_num_threads(threads)
    wl = WORKLOADS["bert_encoder"]
    model = wl.build_fn()
    p = Pipeline()
    texts = _texts(requests)
    x0 = p.pre(texts[0])
    compiled = cu.compile(model, target="cpu", fallback="error")
    ort_run = build_ort(model, (x0,), threads=threads)
    inductor = torch.compile(model, dynamic=False)  # one input shape: its best case
    pool = ThreadPoolExecutor(1)

    def ort_once(x: torch.Tensor) -> torch.Tensor:
        y = ort_run(x)
        return (y[0] if isinstance(y, tuple) else y).clone()  # its output buffer is reused

    with torch.no_grad():
        want = sync_loop(model, p, texts[:8])
        loops: dict[str, Callable[[], list[list[float]]]] = {
            "eager sync": lambda: sync_loop(model, p, texts),
            "torch.compile sync": lambda: sync_loop(inductor, p, texts),
            "torch.compile pipelined (thread)": lambda: pipelined_loop(
                lambda x: pool.submit(inductor, x), p, texts
            ),
            "onnxruntime sync": lambda: sync_loop(ort_once, p, texts),
            "onnxruntime pipelined (thread)": lambda: pipelined_loop(
                lambda x: pool.submit(ort_once, x), p, texts
            ),
            "cuvil sync": lambda: sync_loop(compiled, p, texts),
            "cuvil submit pipelined": lambda: pipelined_loop(compiled.submit, p, texts),
        }
        check: dict[str, float] = {}
        for name, loop in loops.items():  # warm up, and check against eager
            got = loop()[:8]
            check[name] = max(abs(a - b) for r, w in zip(got, want) for a, b in zip(r, w))
        qps: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(repeats):
            for name, loop in loops.items():
                t0 = time.perf_counter()
                loop()
                qps[name].append(requests / (time.perf_counter() - t0))
    pool.shutdown()
    med = {name: statistics.median(v) for name, v in qps.items()}
    return {
        "workload": "bert_encoder batch 1 (seq 128, d 256) between Python pre/post-processing",
        "requests": requests,
        "repeats": repeats,
        "threads": threads,
        "qps_median": med,
        "qps_all": qps,
        "max_abs_err_vs_eager": check,
        "ratios": {
            "cuvil submit / onnxruntime sync": med["cuvil submit pipelined"] / med["onnxruntime sync"],
            "cuvil submit / onnxruntime pipelined": med["cuvil submit pipelined"]
            / med["onnxruntime pipelined (thread)"],
            "cuvil submit / cuvil sync": med["cuvil submit pipelined"] / med["cuvil sync"],
            "cuvil sync / eager sync": med["cuvil sync"] / med["eager sync"],
            "cuvil submit / torch.compile pipelined": med["cuvil submit pipelined"]
            / med["torch.compile pipelined (thread)"],
            "cuvil sync / torch.compile sync": med["cuvil sync"] / med["torch.compile sync"],
        },
    }


_CHILD = """
import sys, time, json
t0 = time.perf_counter()
import cuvil as cu, torch
t1 = time.perf_counter()
from benchmarks.workloads import WORKLOADS
wl = WORKLOADS[sys.argv[1]]
fn, args = wl.build()
mode, path = sys.argv[2], sys.argv[3]
with torch.no_grad():
    t2 = time.perf_counter()
    if mode == "save":
        cu.save(cu.compile(fn, target="cpu", fallback="error"), path, *args)
    elif mode == "compiled":
        y = cu.compile(fn, target="cpu", fallback="error")(*args)
    else:
        y = cu.load(path)(*args)
    t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t3 - t2,
                  "dynamo_imported": "torch._dynamo" in sys.modules}))
"""


def _child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure_warm(workloads: list[str], repeats: int, threads: int) -> dict[str, Any]:
    """Building the workload's module is not timed: only ``cu.compile(...)(x)`` / ``cu.load(p)(x)``."""
    out: dict[str, Any] = {}
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="cuvil-warm-") as tmp:
        env = dict(os.environ, CUVIL_CACHE_DIR=str(Path(tmp) / "cache"), OMP_NUM_THREADS=str(threads))
        # with bytecode caching, as an installed package has it (pip compiles .pyc files);
        # a PYTHONDONTWRITEBYTECODE=1 environment would recompile every lazily imported
        # module of the first call from source (~0.1 s here), in every process
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        for name in workloads:
            art = str(Path(tmp) / f"{name}.cuvil")
            _child([name, "save", art], env)  # fills the cache and writes the artifact
            rows: dict[str, list[float]] = {"compiled": [], "loaded": []}
            dynamo: dict[str, bool] = {}
            for _ in range(repeats):
                for mode in rows:
                    r = _child([name, mode, art], env)
                    rows[mode].append(r["first_call_s"])
                    dynamo[mode] = r["dynamo_imported"]
            out[name] = {
                "compiled_first_call_s": statistics.median(rows["compiled"]),
                "loaded_first_call_s": statistics.median(rows["loaded"]),
                "all": rows,
                "torch._dynamo imported": dynamo,
                "artifact_bytes": os.path.getsize(art),
            }
    return out


def host() -> dict[str, str]:
    from cuvil_backend_cpu.toolchain import cpuinfo, export_toolchain, find_toolchain

    info = cpuinfo()
    return {
        "cpu": info.get("model name", platform.processor()),
        "cores": str(os.cpu_count()),
        "isa (native kernels)": find_toolchain().isa,
        "isa (artifacts)": export_toolchain().isa,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--warm-workloads", default="head,resnet18_b1")
    ap.add_argument("--skip-warm", action="store_true")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args(argv)
    result: dict[str, Any] = {"host": host()}
    print(json.dumps(result["host"]))
    q = result["qps"] = measure_qps(a.requests, a.repeats, a.threads)
    print(
        f"\nQPS, {q['workload']}, {q['requests']} requests, median of {q['repeats']}, {q['threads']} threads"
    )
    for name, v in q["qps_median"].items():
        print(f"  {name:34s} {v:8.1f}   (max |err| vs eager {q['max_abs_err_vs_eager'][name]:.1e})")
    for name, r in q["ratios"].items():
        print(f"  {name:40s} {r:5.2f}x")
    if not a.skip_warm:
        w = result["warm"] = measure_warm(a.warm_workloads.split(","), 3, a.threads)
        print("\nwarm start: first call after `import cuvil`, fresh process, populated cache (median of 3)")
        for name, r in w.items():
            print(
                f"  {name:14s} compiled function {r['compiled_first_call_s']:.3f} s   "
                f"cu.load artifact {r['loaded_first_call_s']:.3f} s   (artifact {r['artifact_bytes'] / 1e6:.1f} MB)"
            )
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
