"""transformers' ``generate()`` on a Llama-style decoder: eager vs torch.compile vs Cuvil.

    python -m benchmarks.generate                      # small model, both caches
    python -m benchmarks.generate --size issue         # the LLM-speed issue's decoder (123 MB fp32)
    python -m benchmarks.generate --caches static --new-tokens 128

Each implementation runs in a fresh child process with empty compile caches (Cuvil's
``CUVIL_CACHE_DIR``, Inductor's ``TORCHINDUCTOR_CACHE_DIR``), so "first generate()" is
a cold start: capture and compile included. Then ``--repeats`` more ``generate()`` calls
give the steady-state tokens/s (median), and one call with another prompt length shows
whether it compiles again. Reported per implementation and cache kind: first
``generate()`` seconds, tokens/s and the ratio to eager's, compiles (Cuvil's
``stats.compiles``; torch.compile's Dynamo frame compiles), whether the tokens equal
eager's (greedy), and the child's peak RSS. Then one more process per cache kind
measures all implementations' tokens/s interleaved round by round, which is the
column to compare (on a shared virtual host the speed drifts between processes
minutes apart). The model is built from a config with random weights (seeded, no
download).

Implementations: ``eager``; ``torch.compile``: ``model.forward = torch.compile(
model.forward)`` (Inductor, its default dynamic handling; for the static cache this is
what transformers recommends for compiled decoding); ``cuvil``: ``cu.compile(model)``
and ``m.generate(...)``. onnxruntime is not in this table: it has no ``generate()``
over a transformers model (onnxruntime-genai needs its own export of the model), and
an exported decoder step without the cache loop would not be the same program.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.llm_peers import peak_rss_mb
from benchmarks.roofline import host_info

SIZES: dict[str, dict[str, int]] = {
    # a few MB: seconds per run, for CI-sized machines
    "small": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "ffn": 704, "vocab": 4000},
    # the LLM-speed issue's decoder: d 512, 8 layers, 8/2 heads, FFN 1408, vocab 8000 (123 MB)
    "issue": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 2, "ffn": 1408, "vocab": 8000},
}
IMPLS = ("eager", "torch.compile", "cuvil")


def build(size: str) -> Any:
    return llama(SIZES[size], max_positions=1024)


def llama(s: dict[str, int], max_positions: int, **extra: Any) -> Any:
    """A Llama-style decoder of the sizes ``s`` (``SIZES``' keys) from a config, random
    weights seeded, no download (benchmarks.llm builds its models with it too)."""
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        max_position_embeddings=max_positions,
        **extra,
    )
    return T.LlamaForCausalLM(cfg).eval().requires_grad_(False)


def _prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=g)


def _setup(cache: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any], torch.Tensor]:
    """The model, generate()'s arguments (greedy, exactly ``--new-tokens``) and the prompt."""
    torch.set_num_threads(args.threads)
    kw: dict[str, Any] = {
        "max_new_tokens": args.new_tokens,
        "do_sample": False,
        "min_new_tokens": args.new_tokens,
    }
    if cache == "static":
        kw["cache_implementation"] = "static"
    return build(args.size), kw, _prompt(SIZES[args.size]["vocab"], args.batch, args.prompt, 1)


def child(impl: str, cache: str, args: argparse.Namespace) -> dict[str, Any]:
    """One implementation, one cache kind, in this (fresh) process."""
    model, kw, ids = _setup(cache, args)
    other = _prompt(SIZES[args.size]["vocab"], args.batch, args.prompt + 7, 2)
    with torch.no_grad():
        want = model.generate(ids, **kw) if impl != "eager" else None
        want_other = model.generate(other, **kw) if impl != "eager" else None
        compiled: Any = None
        if impl == "eager":
            run = model.generate
        elif impl == "torch.compile":
            import torch._dynamo as dynamo

            dynamo.reset()
            model.forward = torch.compile(model.forward)
            run = model.generate
        else:
            import cuvil as cu

            compiled = cu.compile(model, target=args.target)
            run = compiled.generate
        t0 = time.perf_counter()
        got = run(ids, **kw)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            again = run(ids, **kw)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got_other = run(other, **kw)
        other_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "impl": impl,
        "cache": cache,
        "first_s": first,
        "median_s": statistics.median(times),
        "tokens_per_s": args.batch * args.new_tokens / statistics.median(times),
        "other_prompt_s": other_s,
        "peak_rss_mb": peak_rss_mb(),  # VmHWM: ru_maxrss keeps the parent's peak across execve
        "equal_to_eager": None
        if want is None
        else bool(torch.equal(got, want) and torch.equal(again, want) and torch.equal(got_other, want_other)),
    }
    if compiled is not None:
        out["compiles"] = compiled.stats.compiles
        out["fallbacks"] = compiled.stats.fallbacks
    elif impl == "torch.compile":
        import torch._dynamo.utils as du

        out["compiles"] = int(du.counters["stats"]["unique_graphs"])
        out["graph_breaks"] = int(sum(du.counters["graph_break"].values()))
    return out


def steady(cache: str, args: argparse.Namespace) -> dict[str, float]:
    """Tokens/s of every implementation in one process, interleaved round by round (the
    host's speed drifts between child processes: compare within this)."""
    import copy

    import torch._dynamo as dynamo

    import cuvil as cu

    model, kw, ids = _setup(cache, args)
    runs: dict[str, Any] = {}
    for impl in args.impls.split(","):
        if impl == "eager":
            runs[impl] = model.generate
        elif impl == "torch.compile":
            dynamo.reset()
            other = copy.deepcopy(model)
            other.forward = torch.compile(other.forward)
            runs[impl] = other.generate
        else:
            runs[impl] = cu.compile(model, target=args.target).generate
    times: dict[str, list[float]] = {k: [] for k in runs}
    with torch.no_grad():
        for run in runs.values():  # compile and warm up
            run(ids, **kw)
            run(ids, **kw)
        for _ in range(args.repeats):
            for impl, run in runs.items():
                t0 = time.perf_counter()
                run(ids, **kw)
                times[impl].append(time.perf_counter() - t0)
    return {impl: args.batch * args.new_tokens / statistics.median(t) for impl, t in times.items()}


def _markdown(data: dict[str, Any]) -> str:
    c = data["config"]
    isa = data["host"]["isa"]
    lines = [
        f"# generate() on a Llama-style decoder ({c['size']}: {SIZES[c['size']]})",
        "",
        f"Host: {data['host']['cpu']}, {data['host']['cores']} cores, torch {data['host']['torch']}, "
        f"ISA {isa}; {c['threads']} threads; batch {c['batch']}, prompt {c['prompt']}, "
        f"{c['new_tokens']} new tokens (greedy), median of {c['repeats']}; Cuvil target {c['target']}.",
        f"Command: `{c['command']}`",
        "",
        "| cache | impl | first generate() s | tokens/s (own process) | tokens/s interleaved | vs eager (interleaved) | other prompt s | compiles | tokens = eager | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for cache in c["caches"]:
        rows = {r["impl"]: r for r in data["results"] if r["cache"] == cache}
        inter = data.get("interleaved", {}).get(cache, {})
        base = inter.get("eager")
        for impl in IMPLS:
            r = rows.get(impl)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {cache} | {impl} | error: {r['error'][:80]} | | | | | | | |")
                continue
            mine = inter.get(impl)
            ratio = f"{mine / base:.2f}x" if base and mine else ""
            eq = "" if r["equal_to_eager"] is None else ("yes" if r["equal_to_eager"] else "**no**")
            lines.append(
                f"| {cache} | {impl} | {r['first_s']:.2f} | {r['tokens_per_s']:.1f} | "
                f"{'' if mine is None else f'{mine:.1f}'} | {ratio} | "
                f"{r['other_prompt_s']:.2f} | {r.get('compiles', '')} | {eq} | {r['peak_rss_mb']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--caches", default="dynamic,static")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default="cpu")
    p.add_argument("--out", default="benchmarks/results/generate")
    p.add_argument("--child", nargs=2, metavar=("IMPL", "CACHE"), help=argparse.SUPPRESS)
    p.add_argument("--steady", metavar="CACHE", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args)))
        return
    if args.steady:
        print(json.dumps(steady(args.steady, args)))
        return
    caches = args.caches.split(",")
    results = []
    for cache in caches:
        for impl in args.impls.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                env = {
                    **os.environ,
                    "CUVIL_CACHE_DIR": f"{tmp}/cuvil",
                    "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
                    "OMP_NUM_THREADS": str(args.threads),
                }
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks.generate",
                    *(argv or sys.argv[1:]),
                    "--child",
                    impl,
                    cache,
                ]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                results.append({"impl": impl, "cache": cache, "error": tail[0]})
            else:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    interleaved: dict[str, Any] = {}
    for cache in caches:
        cmd = [sys.executable, "-m", "benchmarks.generate", *(argv or sys.argv[1:]), "--steady", cache]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            interleaved[cache] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(cache, "interleaved:", interleaved.get(cache, proc.stderr.strip()[-300:]), flush=True)
    data = {
        "host": host_info(),
        "config": {
            **{k: v for k, v in vars(args).items() if k != "child"},
            "caches": caches,
            "command": " ".join(["python -m benchmarks.generate", *(argv or sys.argv[1:])]),
        },
        "results": results,
        "interleaved": interleaved,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "latest.md").write_text(_markdown(data))
    print(_markdown(data))


if __name__ == "__main__":
    main()
