"""Load on the LLM server (``cuvil_serve``) against one-request-at-a-time ``generate()``.

    python -m benchmarks.serve_llm                       16 clients, small-llama, the server with
                                                         its step compiled (cu.compile) and eager
    python -m benchmarks.serve_llm --steps compiled      the compiled step only
    python -m benchmarks.serve_llm --quick               a smoke run (4 clients, tiny-llama)

N concurrent clients (``--clients``) stream completions from ``python -m cuvil_serve`` (a
subprocess, on loopback) until every request of the workload is served or ``--max-seconds``
pass. The workload is a fixed mix (from ``--seed``) of prompt lengths (16-256 tokens) and
output lengths (16-128 tokens); prompts are token ids, outputs run to ``max_tokens``
(``ignore_eos``), so every request produces exactly the tokens it asked for.

Measured per request on the client: time to first token (TTFT: request sent -> first
streamed token), inter-token latency (ITL: the gaps between streamed chunks, one token
each) and output tokens/s over the whole run. The baselines serve the same requests one
at a time in this process with transformers' ``generate()`` (greedy, a streamer timing
each token): eager, and with the model compiled by ``cu.compile`` (``--no-compiled`` skips
it), each run before and after the server runs and the faster of its two runs kept (the
host's speed drifts over minutes; the bracket keeps the ratios conservative). Their TTFT
excludes queueing (a real one-at-a-time server would add the wait for every
request before). Also: the engine's batch-1 decode step (the ITL target's yardstick).

Writes ``<out>/latest.md`` and ``<out>/latest.json``; the host, its ISA and the load average
(before and after) are in both. Timings on a shared 2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.roofline import host_info

ROOT = Path(__file__).resolve().parent.parent

PROMPT_LENS = [16, 32, 64, 128, 256]
OUTPUT_LENS = [16, 32, 64, 128]


def log(msg: str) -> None:
    print(f"[serve_llm {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def workload(n: int, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        plen, olen = rng.choice(PROMPT_LENS), rng.choice(OUTPUT_LENS)
        out.append(([1] + [rng.randrange(3, vocab) for _ in range(plen - 1)], olen))
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summary(
    name: str, ttft: list[float], itl: list[float], tokens: int, wall: float, done: int
) -> dict[str, Any]:
    return {
        "impl": name,
        "requests": done,
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else float("nan"),
        "ttft_p50_ms": 1e3 * pct(ttft, 50),
        "ttft_p99_ms": 1e3 * pct(ttft, 99),
        "itl_p50_ms": 1e3 * pct(itl, 50),
        "itl_p99_ms": 1e3 * pct(itl, 99),
    }


# -- the server under load ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, port: int, compile: bool) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "cuvil_serve",
        "--model",
        args.model,
        "--port",
        str(port),
        "--num-blocks",
        str(args.num_blocks),
        "--max-seqs",
        str(max(16, args.clients)),
        "--max-tokens-per-step",
        str(args.max_tokens_per_step),
        "--max-prefill-while-decoding",
        str(args.max_prefill_while_decoding),
    ]
    if compile:
        cmd += ["--compile", "--target", "cpu"]
    log(" ".join(cmd[1:]))
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def run_clients(
    url: str, model: str, work: list[tuple[list[int], int]], clients: int, max_s: float
) -> dict[str, Any]:
    import httpx

    queue: asyncio.Queue[tuple[list[int], int]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    ttft: list[float] = []
    itl: list[float] = []
    tokens = 0
    done = 0
    deadline = time.perf_counter() + max_s

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens, done
        while time.perf_counter() < deadline:
            try:
                prompt, n = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": n,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            sent = time.perf_counter()
            last = None
            async with http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    if last is None:
                        ttft.append(now - sent)
                    else:
                        itl.append(now - last)
                    last = now
            tokens += n
            done += 1

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=max_s + 60, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return summary("cuvil-serve", ttft, itl, tokens, time.perf_counter() - start, done)


def server_metrics(url: str) -> dict[str, float]:
    """compiles, preemptions, steps and the step's threads from the server's /metrics."""
    import httpx

    names = (
        "cuvil_serve_compiles",
        "cuvil_serve_preemptions_total",
        "cuvil_serve_steps_total",
        "cuvil_serve_threads",
    )
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(names):
            name, value = line.split()
            out[name.removeprefix("cuvil_serve_").removesuffix("_total")] = float(value)
    return out


def serve_run(args: argparse.Namespace, work: list[tuple[list[int], int]], compile: bool) -> dict[str, Any]:
    import httpx

    port = free_port()
    proc = start_server(args, port, compile)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
                )
            time.sleep(0.2)
        # warm-up: one short and one long request (the compiled step compiles here)
        log("warm-up")
        asyncio.run(run_clients(url, args.model, [work[0][:1] + (4,), ([1] * 200, 4)], 2, 600))
        warm = server_metrics(url)
        log(f"{args.clients} clients, {len(work)} requests, at most {args.max_seconds:.0f} s")
        result = asyncio.run(run_clients(url, args.model, work, args.clients, args.max_seconds))
        after = server_metrics(url)
        result.update(after)
        result["recompiles"] = after.get("compiles", 0) - warm.get("compiles", 0)
        result["impl"] = "cuvil-serve, compiled step" if compile else "cuvil-serve, eager step"
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- the baselines: one request at a time --------------------------------------------------------


class _Timer:
    """A transformers streamer that times each token (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.calls = 0

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls > 1:
            self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def generate_run(name: str, model: Any, work: list[tuple[list[int], int]], max_s: float) -> dict[str, Any]:
    ttft: list[float] = []
    itl: list[float] = []
    tokens = done = 0
    start = time.perf_counter()
    with torch.no_grad():
        for prompt, n in work:
            if time.perf_counter() - start > max_s:
                break
            timer = _Timer()
            sent = time.perf_counter()
            ids = torch.tensor([prompt])
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=timer)
            ttft.append(timer.times[0] - sent)
            itl.extend(b - a for a, b in zip(timer.times, timer.times[1:]))
            tokens += n
            done += 1
    return summary(name, ttft, itl, tokens, time.perf_counter() - start, done)


def batch1_decode_step_ms(loaded: Any, compile: bool) -> float:
    """The engine's decode step for one sequence of 64 tokens (the server's step: compiled
    with ``compile``): the lowest of three medians of 32 steps (the machine is shared)."""
    from cuvil_serve.engine import Engine, EngineConfig
    from cuvil_serve.sampling import SamplingParams

    config = EngineConfig(num_blocks=64, block_size=16, compile=compile, target="cpu" if compile else None)
    engine = Engine(loaded, config)
    medians = []
    for _ in range(3):
        engine.add_request([1] * 64, SamplingParams(max_tokens=33, temperature=0, ignore_eos=True))
        engine.step()  # the prompt
        times = []
        while engine.has_work():
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times))
    return 1e3 * min(medians)


# -- report ---------------------------------------------------------------------------------------


def write(out: Path, header: dict[str, Any], rows: list[dict[str, Any]], notes: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(
        json.dumps({"header": header, "rows": rows, "notes": notes}, indent=2) + "\n"
    )
    lines = [
        f"# LLM serving: {header['clients']} concurrent clients vs one request at a time ({header['model']})",
        "",
        f"Host: {header['host']['cpu']}, {header['host']['cores']} cores, torch {header['host']['torch']}, "
        f"ISA {header['host']['isa']}; {header['threads']} torch threads; load average before "
        f"{header['load_before']}, after {header['load_after']}.",
        f"Command: `{header['command']}`. Workload: {header['requests']} requests, prompts "
        f"{PROMPT_LENS} tokens, outputs {OUTPUT_LENS} tokens (seed {header['seed']}), greedy, "
        "every output to max_tokens.",
        "",
        "| impl | requests | output tokens | wall s | tokens/s | vs generate() eager | vs generate() cu.compile "
        "| TTFT P50 ms | TTFT P99 ms | ITL P50 ms | ITL P99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = next((r["tokens_per_s"] for r in rows if r["impl"] == "generate() eager"), None)
    base_c = next((r["tokens_per_s"] for r in rows if r["impl"] == "generate() cu.compile"), None)
    for r in rows:
        speed = f"{r['tokens_per_s'] / base:.2f}x" if base else ""
        speed_c = f"{r['tokens_per_s'] / base_c:.2f}x" if base_c else ""
        lines.append(
            f"| {r['impl']} | {r['requests']} | {r['output_tokens']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.1f} | "
            f"{speed} | {speed_c} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} | "
            f"{r['itl_p99_ms']:.1f} |"
        )
    lines += ["", *(f"- {n}" for n in notes), ""]
    (out / "latest.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small-llama")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-seconds", type=float, default=180)
    p.add_argument("--num-blocks", type=int, default=512)
    p.add_argument("--max-tokens-per-step", type=int, default=128)
    p.add_argument(
        "--max-prefill-while-decoding", type=int, default=32, help="the server's flag (0: the whole budget)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--steps",
        default="compiled,eager",
        help="the server's step: compiled (cu.compile, cpu), eager, or both",
    )
    p.add_argument("--no-compiled", action="store_true", help="skip the compiled generate() baseline")
    p.add_argument("--server-only", action="store_true", help="no generate() baselines (tuning runs)")
    p.add_argument("--quick", action="store_true", help="tiny-llama, 4 clients, 8 requests")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_llm"))
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.clients, args.requests, args.max_seconds = "tiny-llama", 4, 8, 60
    from cuvil_serve.models import build_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    load_before = os.getloadavg()
    loaded = build_model(args.model, seed=0)
    work = workload(args.requests, args.seed, loaded.tokenizer.vocab_size)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    if not steps or set(steps) - {"compiled", "eager"}:
        p.error(f"--steps takes compiled and/or eager, got {args.steps!r}")
    rows = []
    notes = []
    # the baselines: eager and compiled generate(), one request at a time, each run before
    # and after the server runs; the faster of its two runs is its row (the host's speed
    # drifts by tens of percent over minutes: the bracket keeps the ratios conservative)
    baselines: list[tuple[str, Any]] = []
    if not args.server_only:
        baselines.append(("generate() eager", loaded.model))
    if not args.no_compiled and not args.server_only:
        import cuvil as cu

        try:
            compiled = cu.compile(loaded.model, target="cpu", fallback="error")
            t = time.perf_counter()
            with torch.no_grad():
                compiled.generate(torch.tensor([work[0][0]]), max_new_tokens=2, do_sample=False)
            notes.append(
                f"compiled generate(): warm-up (compiles) {time.perf_counter() - t:.1f} s, not in the table."
            )
            baselines.append(("generate() cu.compile", compiled))
        except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
            notes.append(f"compiled generate() failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            compiled = None
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in baselines}

    def run_baselines(when: str) -> None:
        for name, model in baselines:
            log(f"{name}, one request at a time ({when} the server runs)")
            runs[name].append(generate_run(name, model, work, args.max_seconds))

    run_baselines("before")
    for kind in steps:
        row = serve_run(args, work, kind == "compiled")
        rows.append(row)
        notes.append(
            f"{row['impl']}: {row.get('steps', 0):.0f} steps, {row.get('preemptions', 0):.0f} preemptions, "
            f"{row.get('compiles', 0):.0f} compiles of the step, {row.get('recompiles', 0):.0f} of them after warm-up; "
            f"the step on {row.get('threads', 0):.0f} torch threads (the server's --threads auto: one core left "
            "to its HTTP event loop)."
        )
    run_baselines("after")
    for name, _ in baselines:
        rows.append(max(runs[name], key=lambda r: r["tokens_per_s"]))
        speeds = ", ".join(f"{r['tokens_per_s']:.1f}" for r in runs[name])
        notes.append(f"{name}: the faster of two runs, before and after the server's ({speeds} tokens/s).")
    if baselines and baselines[-1][0] == "generate() cu.compile":
        notes.append(
            f"compiled generate(): {compiled.stats.compiles} compiles, {compiled.stats.fallbacks} fallbacks."
        )
    server_threads = {int(r["threads"]) for r in rows if r.get("threads")}
    for kind in steps:
        step_ms = batch1_decode_step_ms(loaded, kind == "compiled")
        fastest, other = step_ms, ""
        for t in sorted(server_threads - {torch.get_num_threads()}):
            before = torch.get_num_threads()
            torch.set_num_threads(t)
            try:
                ms = batch1_decode_step_ms(loaded, kind == "compiled")
            finally:
                torch.set_num_threads(before)
            fastest = min(fastest, ms)
            other += f" ({ms:.1f} ms on the server's {t} thread(s))"
        notes.append(
            f"the engine's batch-1 decode step ({kind}, 64-token context, {torch.get_num_threads()} threads): "
            f"{step_ms:.1f} ms{other}; target P99 ITL <= 2x the faster = {2 * fastest:.1f} ms."
        )
    notes.append(
        "baseline TTFT is the time of the prompt's forward for a request served alone (no queueing); "
        "requests past --max-seconds are not run (see the requests column)."
    )
    header = {
        "model": args.model,
        "clients": args.clients,
        "requests": len(work),
        "seed": args.seed,
        "threads": torch.get_num_threads(),
        "host": host_info(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "command": "python -m benchmarks.serve_llm " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    write(Path(args.out), header, rows, notes)


if __name__ == "__main__":
    main()
