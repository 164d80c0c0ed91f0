"""LLM decode and prefill on CPU: eager vs torch.compile vs Cuvil, fp32 / bf16 / int8 / int4.

    python -m benchmarks.llm                                  # the 123 MB decoder, every precision
    python -m benchmarks.llm --sizes issue,1gb --batches 1,4,16
    python -m benchmarks.llm --precisions fp32,int8 --impls eager,cuvil --quick

Decoding one token at batch 1 reads every weight once, so its speed limit is memory
bandwidth / bytes of weights. This script measures, for Llama-style decoders built from a
config with random weights (seeded, no download) at two sizes (``issue``: d 512, 8
layers, 8/2 heads, FFN 1408, vocab 8000, 123 MB of fp32 weights; ``1gb``: d 1536, 10
layers, 12/4 heads, FFN 4096, vocab 32000, ~1 GB):

* **decode tokens/s** at each ``--batches`` size: greedy ``generate()`` with exactly
  ``--new-tokens`` new tokens and with one, the difference being the decode steps
  (prefill excluded): ``batch * (n - 1) / (t_n - t_1)``, median of ``--repeats``;
* **time to first token** for prompts of ``--ttft-prompts`` tokens at batch 1:
  ``generate(max_new_tokens=1)``;
* **peak RSS** of the child process (model build, compile and runs);
* **the weight-bandwidth bound**: bytes of the weights a decode step reads (the
  quantized bytes for int8/int4, bf16 for bf16) / the rate ``torch.mv`` streams a
  ``--stream-mib`` f32 matrix, timed in the parent in the same run (the copy and
  ``x.sum()`` rates beside it), and each implementation's batch-1 decode as a fraction
  of its precision's bound.

Implementations, each in a fresh child process (empty compile caches):

* ``eager``: the transformers model (``model.to(torch.bfloat16)`` for bf16; for int8 and
  int4 torchao's weight-only configs when torchao is installed, else skipped, saying so);
* ``torch.compile``: the same model with ``model.forward = torch.compile(model.forward)``
  and ``cache_implementation="static"``, as transformers documents for compiled decoding;
* ``cuvil``: ``cu.compile(model)`` on ``cu.quantize(model, precision)`` for bf16 / int8 /
  int4 (group ``--group-size``), the fp32 model otherwise, static cache.

Not in the table, and why: onnxruntime has no ``generate()`` over a transformers model
(onnxruntime-genai needs its own model builder output, not installed here), and llama.cpp
is measured only where ``llama_cpp`` imports (llama-cpp-python builds llama.cpp from
source; it needs a GGUF export of the model and a tokenizer) -- the ``llama.cpp`` column
says which.

The machine this runs on is shared and noisy: every number comes with the host, its ISA,
the threads, and the bound measured in the same run; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SIZES: dict[str, dict[str, int]] = {
    # the LLM-speed issue's decoder (123 MB of fp32 weights)
    "issue": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 2, "ffn": 1408, "vocab": 8000},
    # about 1 GB of fp32 weights
    "1gb": {"hidden": 1536, "layers": 10, "heads": 12, "kv_heads": 4, "ffn": 4096, "vocab": 32000},
}
IMPLS = ("eager", "torch.compile", "cuvil")
PRECISIONS = ("fp32", "bf16", "int8", "int4")


def build(size: str) -> Any:
    import transformers as T

    s = SIZES[size]
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return T.LlamaForCausalLM(cfg).eval().requires_grad_(False)


def weight_bytes(model: Any, precision: str, group_size: int) -> int:
    """Bytes a decode step reads: every linear's weight (the lm_head included) in the
    precision's storage, plus scales/zero points; norms in fp32. The token embedding is a
    gather of one row per token, not streamed."""
    total = 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        if p.dim() == 2:
            n, k = p.shape
            if precision == "fp32":
                total += n * k * 4
            elif precision == "bf16":
                total += n * k * 2
            elif precision == "int8":
                total += n * k + n * 4
            else:  # int4: two per byte, a scale and a zero point per group
                total += n * k // 2 + n * (k // group_size) * 8
        else:
            total += p.numel() * 4
    return total


def _stream_rates(mib: int, threads: int) -> dict[str, float]:
    """GB/s of ``torch.mv`` over a ``mib`` f32 matrix (the weights of a decode step read
    once), of ``dst.copy_(src)`` (read + write) and of ``x.sum()``: medians of 7."""
    torch.set_num_threads(threads)
    n = 4096
    rows = mib * 2**20 // (4 * n)
    a = torch.randn(rows, n)
    x = torch.randn(n)
    flat = a.view(-1)
    dst = torch.empty_like(flat)

    def med(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    nbytes = a.numel() * 4
    return {
        "mv_gbps": nbytes / med(lambda: torch.mv(a, x)) / 1e9,
        "copy_gbps": 2 * nbytes / med(lambda: dst.copy_(flat)) / 1e9,
        "sum_gbps": nbytes / med(lambda: flat.sum()) / 1e9,
    }


def _eager_model(size: str, precision: str, group_size: int) -> Any:
    model = build(size)
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision in ("int8", "int4"):
        try:
            from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
        except ImportError as e:
            raise SystemExit(f"skipped: torchao is not installed ({e})") from None
        config = (
            Int8WeightOnlyConfig() if precision == "int8" else Int4WeightOnlyConfig(group_size=group_size)
        )
        quantize_(model, config)
    return model


def _prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=g)


def child(impl: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    """One implementation at one precision, in this (fresh) process."""
    torch.set_num_threads(args.threads)
    size = args.size
    vocab = SIZES[size]["vocab"]
    if impl == "cuvil":
        import cuvil as cu

        model = build(size)
        if precision != "fp32":
            model = cu.quantize(model, precision, group_size=args.group_size)
        run_model = cu.compile(model, target=args.target)
        generate = run_model.generate
    else:
        model = _eager_model(size, precision, args.group_size)
        if impl == "torch.compile":
            import torch._dynamo as dynamo

            dynamo.reset()
            model.forward = torch.compile(model.forward)
        run_model = None
        generate = model.generate
    kw: dict[str, Any] = {"do_sample": False}
    if impl != "eager":
        kw["cache_implementation"] = "static"
    out: dict[str, Any] = {"impl": impl, "precision": precision, "size": size}
    n = args.new_tokens
    with torch.no_grad():
        t0 = time.perf_counter()
        generate(_prompt(vocab, 1, args.prompt, 1), max_new_tokens=n, min_new_tokens=n, **kw)
        out["first_generate_s"] = time.perf_counter() - t0
        decode: dict[str, float] = {}
        for batch in args.batches:
            ids = _prompt(vocab, batch, args.prompt, batch)
            generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)  # this batch's variants
            longs, shorts = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
                longs.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                generate(ids, max_new_tokens=1, **kw)
                shorts.append(time.perf_counter() - t0)
            step = (statistics.median(longs) - statistics.median(shorts)) / (n - 1)
            decode[str(batch)] = batch / step
        out["decode_tokens_per_s"] = decode
        ttft: dict[str, float] = {}
        for length in args.ttft_prompts:
            ids = _prompt(vocab, 1, length, length)
            generate(ids, max_new_tokens=1, **kw)
            ts = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                generate(ids, max_new_tokens=1, **kw)
                ts.append(time.perf_counter() - t0)
            ttft[str(length)] = statistics.median(ts)
        out["ttft_s"] = ttft
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if run_model is not None:
        out["compiles"] = run_model.stats.compiles
        out["fallbacks"] = run_model.stats.fallbacks
    return out


def _host() -> dict[str, Any]:
    from benchmarks.roofline import host_isa

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "isa": host_isa()}


def _markdown(data: dict[str, Any]) -> str:
    c = data["config"]
    rates = data["rates"]
    lines = [
        f"# LLM decode and prefill on CPU ({c['size']}: {SIZES[c['size']]})",
        "",
        f"Host: {data['host']['cpu']}, {data['host']['cores']} cores, torch {data['host']['torch']}, "
        f"ISA {data['host']['isa']}; {c['threads']} threads; prompt {c['prompt']}, {c['new_tokens']} "
        f"new tokens (greedy), median of {c['repeats']}; Cuvil target {c['target']}, int4 group "
        f"{c['group_size']}.",
        f"Streaming rates in this run ({c['stream_mib']} MiB f32): torch.mv {rates['mv_gbps']:.1f} GB/s "
        f"(the bound's rate), copy {rates['copy_gbps']:.1f} GB/s (read + write), sum "
        f"{rates['sum_gbps']:.1f} GB/s.",
        f"Command: `{c['command']}`",
        "",
    ]
    batches = [str(b) for b in c["batches"]]
    prompts = [str(p) for p in c["ttft_prompts"]]
    head = (
        ["precision", "weights MB", "bound tok/s", "impl"]
        + [f"decode tok/s b{b}" for b in batches]
        + ["fraction of bound (b1)"]
        + [f"TTFT {p} s" for p in prompts]
        + ["first generate() s", "peak RSS MB", "compiles"]
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data["results"]:
        prec = r["precision"]
        wb = data["weight_bytes"][prec]
        bound = rates["mv_gbps"] * 1e9 / wb
        if "error" in r:
            lines.append(f"| {prec} | {wb / 1e6:.0f} | {bound:.0f} | {r['impl']} | {r['error'][:100]} |")
            continue
        dec = r["decode_tokens_per_s"]
        row = [prec, f"{wb / 1e6:.0f}", f"{bound:.0f}", r["impl"]]
        row += [f"{dec[b]:.1f}" for b in batches]
        row += [f"{dec[batches[0]] / bound:.2f}" if batches[0] == "1" else ""]
        row += [f"{r['ttft_s'][p]:.3f}" for p in prompts]
        row += [f"{r['first_generate_s']:.1f}", f"{r['peak_rss_mb']:.0f}", str(r.get("compiles", ""))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="issue")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--ttft-prompts", default="128,1024")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--stream-mib", type=int, default=256)
    p.add_argument("--target", default="cpu")
    p.add_argument("--child-timeout", type=int, default=3600)
    p.add_argument("--quick", action="store_true", help="batch 1, a 128-token TTFT prompt, 1 repeat")
    p.add_argument("--out", default="benchmarks/results/llm")
    p.add_argument("--child", nargs=2, metavar=("IMPL", "PRECISION"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.ttft_prompts, args.repeats = "1", "128", 1
    args.batches = [int(b) for b in str(args.batches).split(",")]
    args.ttft_prompts = [int(n) for n in str(args.ttft_prompts).split(",")]
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args)))
        return
    rates = _stream_rates(args.stream_mib, args.threads)
    print("streaming rates:", rates, flush=True)
    model = build(args.size)
    precisions = args.precisions.split(",")
    wbytes = {prec: weight_bytes(model, prec, args.group_size) for prec in precisions}
    del model
    results = []
    for prec in precisions:
        for impl in args.impls.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                env = {
                    **os.environ,
                    "CUVIL_CACHE_DIR": f"{tmp}/cuvil",
                    "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
                    "OMP_NUM_THREADS": str(args.threads),
                }
                cmd = [sys.executable, "-m", "benchmarks.llm", *(argv or sys.argv[1:]), "--child", impl, prec]
                try:
                    proc = subprocess.run(
                        cmd, env=env, capture_output=True, text=True, check=False, timeout=args.child_timeout
                    )
                except subprocess.TimeoutExpired:
                    results.append({"impl": impl, "precision": prec, "error": "timed out"})
                    continue
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                results.append({"impl": impl, "precision": prec, "error": tail[0]})
            else:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    data = {
        "host": _host(),
        "config": {
            **{k: v for k, v in vars(args).items() if k != "child"},
            "command": " ".join(["python -m benchmarks.llm", *(argv or sys.argv[1:])]),
        },
        "rates": rates,
        "weight_bytes": wbytes,
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.size}.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / f"{args.size}.md").write_text(_markdown(data))
    print(_markdown(data))


if __name__ == "__main__":
    main()
