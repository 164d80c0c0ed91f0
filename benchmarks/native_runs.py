"""Native runs against the same program's steps called from Python ([Note: native runs] in
cuvil_runtime/native_runs.py, docs/native-runner.md): the issue-29 Llama's ``generate()``.

    python -m benchmarks.native_runs                          # from the repo root, in a dev venv
    python -m benchmarks.native_runs --precisions int4-a8 int8 fp32 --threads 1 --rounds 9

Per precision, one process compiles the model twice, once with native runs and once with
``CUVIL_NATIVE_RUNS=0`` (each wrapper is made under its setting), and alternates them: each
round times a 65-token ``generate()`` (static cache, greedy) minus a 1-token one, for each
executor in turn, so load from other processes hits both alike. Reports the median and the
minimum ms per decoded token, the ratio of the medians, the native runs of the decode step's
wrapper and the steps they hold, and whether the two executors' tokens are equal. Markdown on
stdout (and ``--out file.md``) with the host's CPU and ISA.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.llm import build
from benchmarks.roofline import host_info


def _compiled(model: Any, native: bool) -> Any:
    import cuvil as cu
    import cuvil.api
    from cuvil_runtime.cache import CompileCache

    os.environ["CUVIL_NATIVE_RUNS"] = "1" if native else "0"
    cuvil.api._EXECUTABLES = CompileCache()  # (the wrapper is made under the setting, not found in-process)
    return cu.compile(model, target="cpu")


def _decode_runs(compiled: Any) -> tuple[int, int, int]:
    """(native runs, steps in them, steps in all) of the decode step's wrapper: the program
    compiled last (the prompt's step, which also makes the static cache, compiles first)."""
    from cuvil_runtime.pipeline import ProgramExecutable

    programs = [a.executable for a in compiled.artifacts if isinstance(a.executable, ProgramExecutable)]
    if not programs:
        return (0, 0, 0)
    r = programs[-1]._runner
    return (len(r.runs), sum(len(x.steps) for x in r.runs), len(r.program.steps))


def measure(precision: str, args: argparse.Namespace) -> dict[str, Any]:
    import cuvil as cu

    torch.manual_seed(0)
    model = build("issue").eval()
    if precision != "fp32":
        model = cu.quantize(model, precision, group_size=args.group_size)
    ids = torch.randint(0, 8000, (1, 32))
    kw: dict[str, Any] = {"do_sample": False, "cache_implementation": "static"}

    def generate(m: Any, n: int) -> Any:
        with torch.no_grad():
            return m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    runs = {}
    for name, native in (("native runs", True), ("Python steps", False)):
        m = _compiled(model, native)
        generate(m, 8)
        runs[name] = m
    os.environ.pop("CUVIL_NATIVE_RUNS", None)
    tokens = [generate(m, 24) for m in runs.values()]
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, m in runs.items():
            t0 = time.perf_counter()
            generate(m, 65)
            t1 = time.perf_counter()
            generate(m, 1)
            t2 = time.perf_counter()
            times[name].append(1e3 * ((t1 - t0) - (t2 - t1)) / 64)
    return {
        "precision": precision,
        "times": times,
        "runs": _decode_runs(runs["native runs"]),
        "equal": bool(torch.equal(tokens[0], tokens[1])),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", nargs="+", default=["int4-a8", "int8", "fp32"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    host = host_info()
    isa = ", ".join(k for k, v in host["isa"].items() if v) or "baseline"
    lines = [
        f"host: {host['cpu']} ({isa}), {host['cores']} logical CPUs, {args.threads} thread(s), "
        f"torch {host['torch']}; the issue-29 Llama (benchmarks/llm.py `issue`), 32-token prompt, "
        f"static cache, greedy; {args.rounds} alternated rounds of 64 decoded tokens",
        "",
        "| precision | Python steps ms/token (median, min) | native runs ms/token (median, min) "
        "| Python / native (medians) | decode step: runs, steps in them / all steps | tokens equal |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for precision in args.precisions:
        r = measure(precision, args)
        py, nat = r["times"]["Python steps"], r["times"]["native runs"]
        n_runs, in_runs, steps = r["runs"]
        lines.append(
            f"| {precision} | {statistics.median(py):.2f}, {min(py):.2f} | "
            f"{statistics.median(nat):.2f}, {min(nat):.2f} | "
            f"{statistics.median(py) / statistics.median(nat):.3f}x | {n_runs}, {in_runs} / {steps} | "
            f"{'yes' if r['equal'] else 'NO'} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
