"""Where each zoo model's time goes, in Cuvil and in onnxruntime, by kind of work.

    PYTHONPATH=. python -m benchmarks.zoo_profile                       # every zoo model
    PYTHONPATH=. python -m benchmarks.zoo_profile --models t5 bert --threads 1 --batch 4

The issue this serves (the zoo behind onnxruntime) asks for profiles first: per model, the
time of each kind of work beside onnxruntime's profile of the same model, so the work goes
down the table. Per model, in one process:

* **Cuvil**: the compiled model's median call (``--calls`` calls), then the same calls with
  every kernel and extern call of the generated wrapper (and of its control-flow regions)
  timed by a ``perf_counter`` wrapper around it. Extern calls are classed by their op
  (``linear``, ``matmul`` ... are gemm; ``sdpa`` attention), kernels by their Tensor IR
  (a reduction with ``exp`` is a softmax, with ``rsqrt``/``sqrt`` a norm, a plain load a
  layout copy, the rest elementwise). ``per call``: the median call minus the timed parts
  (argument checks, guards, the size plan, output allocation, the Python between calls).
* **onnxruntime**: the model exported and run as ``benchmarks/ort.py`` does, with its own
  profiler on: each node's time by its op type, ``per call`` = the median ``run()`` minus the
  nodes' mean total (binding, the executor between nodes).

The wrappers add about a microsecond a call to the timed parts, so the kinds sum to a little
more than the unwrapped call; the table shows both. onnxruntime's profiler slows what it
profiles (its whole call here is well above its unprofiled time), and the two sides run one
after the other: the columns say where each side's time goes; which side is faster is the
interleaved zoo table's to say (``python -m benchmarks.run --workloads zoo``). Kinds: gemm (linears, matmuls,
convolutions), attention (fused attention kernels), softmax, norm, elementwise, layout
(copies, transposes, gathers, concatenations, casts, shape ops), other.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.ort import build_ort
from benchmarks.workloads import DTYPE_ENV, WORKLOADS

KINDS = ("gemm", "attention", "softmax", "norm", "elementwise", "layout", "other")

#: Cuvil extern ops by kind (ops not listed are "other")
_CUVIL_OPS = {
    "gemm": set(
        "linear matmul mm bmm addmm baddbmm conv1d conv2d conv3d convolution cpu_linear_group "
        "cpu_linear_epilogue cpu_conv_epilogue weight_only_linear".split()
    ),
    "attention": {"sdpa", "cpu_attention", "paged_attention"},
    "softmax": {"softmax", "log_softmax"},
    "norm": {"layer_norm", "rms_norm", "group_norm", "batch_norm"},
    "layout": set("embedding cat gather index_select copy contiguous index".split()),
}
#: onnxruntime op types by kind (ReduceMean, Pow, Sqrt and Reciprocal: the parts of a norm
#: its optimizer did not fuse)
_ORT_OPS = {
    "gemm": set("MatMul Gemm FusedMatMul MatMulNBits MatMulInteger Conv FusedConv FusedGemm".split()),
    "attention": {"Attention", "MultiHeadAttention", "GroupQueryAttention"},
    "softmax": {"Softmax", "LogSoftmax"},
    "norm": set(
        "LayerNormalization SkipLayerNormalization SimplifiedLayerNormalization "
        "SkipSimplifiedLayerNormalization RMSNormalization ReduceMean Sqrt Reciprocal Pow".split()
    ),
    "layout": set(
        "Transpose Reshape Concat Slice Gather GatherElements Unsqueeze Squeeze Expand Shape Cast Split "
        "Identity Flatten ConstantOfShape Range Tile ScatterND NonZero Trilu".split()
    ),
}
_REDUCTION = re.compile(r"\b(sum|max|min|prod|mean)\(_r\d+")
_PLAIN_LOAD = re.compile(r"^%\w+\[[^\]]*\]$")


def kernel_kind(text: str) -> str:
    """The kind of a Tensor IR kernel, from its text (``kernel kN [dims] { %b[..] = body }``)."""
    body = text.split(" = ", 1)[1].rsplit(" }", 1)[0] if " = " in text else text
    if _REDUCTION.search(body):
        if "exp(" in body:
            return "softmax"
        if "rsqrt(" in body or "sqrt(" in body:
            return "norm"
        return "other"
    if _PLAIN_LOAD.match(body.strip()):
        return "layout"
    return "elementwise"


def _op_kind(op: str, table: dict[str, set[str]]) -> str:
    for kind, ops in table.items():
        if op in ops:
            return kind
    return "elementwise" if table is _ORT_OPS and op in _ORT_ELEMENTWISE else "other"


_ORT_ELEMENTWISE = set(
    "Add Sub Mul Div Gelu FastGelu BiasGelu QuickGelu BiasAdd Erf Tanh Relu Sigmoid Where Neg Cos Sin "
    "Equal Less Greater Not And Or Max Min Abs Log Exp Clip".split()
)


def _runners(runner: Any) -> list[Any]:
    """A program runner and the runners of its control-flow regions (and of theirs)."""
    out = [runner]
    for regions in getattr(runner, "regions", {}).values():
        for r in regions:
            out += _runners(r)
    return out


def _median_call(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_cuvil(model: Any, args: tuple[Any, ...], calls: int) -> dict[str, Any]:
    """Cuvil's median call and its time per kind (ms per call)."""
    import cuvil as cu

    compiled = cu.compile(model, target="cpu")
    with torch.no_grad():
        for _ in range(3):
            compiled(*args)
        total = _median_call(lambda: compiled(*args), calls)
        arts = [a for a in compiled.artifacts if a.executable is not None]
        if not arts or compiled.stats.fallbacks:
            return {"error": f"fell back to eager: {compiled.stats.fallback_reasons[-1:]}"}
        runner = arts[-1].executable._runner
        spent: collections.Counter[str] = collections.Counter()
        ops: collections.Counter[str] = collections.Counter()
        for r in _runners(runner):
            ns = r._run.__globals__
            kinds: dict[str, tuple[str, str]] = {}
            for step in r.program.steps:
                if type(step).__name__ == "Kernel":
                    kinds[f"_k_{step.name}"] = (kernel_kind(str(step)), "kernel:" + kernel_kind(str(step)))
                elif type(step).__name__ == "Extern":
                    op = step.node.op
                    kinds[f"_x_{step.name}"] = (_op_kind(op, _CUVIL_OPS), op)
            for name, (kind, label) in kinds.items():
                fn = ns.get(name)
                if fn is None or getattr(fn, "_profiled", False):
                    continue

                def timed(*a: Any, _fn: Any = fn, _kind: str = kind, _label: str = label, **k: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return _fn(*a, **k)
                    finally:
                        dt = time.perf_counter() - t0
                        spent[_kind] += dt
                        ops[_label] += dt

                timed._profiled = True  # type: ignore[attr-defined]
                ns[name] = timed
        for _ in range(calls):
            compiled(*args)
    out = {k: spent[k] / calls * 1e3 for k in KINDS}
    out["per call"] = total * 1e3 - sum(out.values())
    out["total"] = total * 1e3
    out["top"] = [(label, t / calls * 1e3) for label, t in ops.most_common(6)]
    return out


def profile_ort(model: Any, args: tuple[Any, ...], calls: int, threads: int) -> dict[str, Any]:
    """onnxruntime's median run and its nodes' time per kind (ms per call)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            run = build_ort(model, args, threads=threads, profile=os.path.join(d, "ort"))
        except Exception as e:  # noqa: BLE001 -- a model that does not export gets a reason
            return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
        for _ in range(3):
            run(*args)
        total = _median_call(lambda: run(*args), calls)
        path = run.end_profiling()
        with open(path) as f:
            events = json.load(f)
    spent: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        spent[_op_kind(op, _ORT_OPS)] += e["dur"]
        ops[op] += e["dur"]
    runs = max(runs, 1)
    out = {k: spent[k] / runs / 1e3 for k in KINDS}
    out["per call"] = total * 1e3 - sum(out.values())
    out["total"] = total * 1e3
    out["top"] = [(op, t / runs / 1e3) for op, t in ops.most_common(6)]
    return out


def _row(model: str, impl: str, p: dict[str, Any]) -> str:
    if "error" in p:
        return f"| {model} | {impl} | {p['error']} |"
    cells = [f"{p[k]:.2f}" for k in (*KINDS, "per call")]
    top = ", ".join(f"{label} {t:.2f}" for label, t in p["top"][:4])
    return f"| {model} | {impl} | {p['total']:.2f} | " + " | ".join(cells) + f" | {top} |"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo = sorted(n[4:] for n, wl in WORKLOADS.items() if wl.kind == "zoo")
    p.add_argument("--models", nargs="+", default=zoo, choices=zoo)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=30, help="calls per measurement")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), help="models and float inputs in this dtype")
    a = p.parse_args(argv)
    if a.dtype is not None:
        os.environ[DTYPE_ENV] = a.dtype  # the workloads read it when built
    torch.set_num_threads(a.threads)
    from cuvil_backend_cpu import toolchain

    isa = toolchain.find_toolchain().isa
    lines = [
        f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, cpu target ISA {isa}, "
        f"{a.threads} threads, batch {a.batch}, {a.dtype or 'float32'}, torch {torch.__version__}; ms per call, medians of {a.calls}",
        "",
        "| model | impl | call ms | " + " | ".join(KINDS) + " | per call | largest parts (ms) |",
        "|---|---|---:|" + "---:|" * (len(KINDS) + 1) + "---|",
    ]
    print("\n".join(lines), flush=True)
    for name in a.models:
        wl = WORKLOADS[f"zoo_{name}"]
        model = wl.build_fn()
        args = wl.inputs(a.batch)
        rows = [
            _row(name, "cuvil", profile_cuvil(model, args, a.calls)),
            _row(name, "onnxruntime", profile_ort(model, args, a.calls, a.threads)),
        ]
        print("\n".join(rows), flush=True)
        lines += rows
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
