"""LLM decode and prefill on CPU: eager vs torch.compile vs Cuvil, fp32 / bf16 / int8 / int4 / int4-a8.

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
* **peak RSS** of the child process (model build or load, compile and runs): its
  ``VmHWM``, which starts afresh at ``execve`` (``ru_maxrss`` would carry this, larger,
  process's peak into every child);
* **the weight-bandwidth bound**: bytes of the weights a decode step reads (the
  quantized bytes for int8/int4, bf16 for bf16) / the rate ``torch.mv`` streams a
  ``--stream-mib`` f32 matrix, timed in the parent in the same run (the copy and
  ``x.sum()`` rates beside it), and each implementation's batch-1 decode as a fraction
  of its precision's bound.

Implementations (``--impls``), each in a fresh child process (empty compile caches):

* ``eager``: the transformers model (``model.to(torch.bfloat16)`` for bf16; for int8 and
  int4 torchao's weight-only configs, ``Int8WeightOnlyConfig`` and, for int4 on CPU,
  ``PrototypeInt4WeightOnlyConfig``; for int4-a8 its 8da4w,
  ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(g))``;
  when torchao is installed, else skipped, saying so);
* ``torch.compile``: the same model with ``model.forward = torch.compile(model.forward)``
  and ``cache_implementation="static"``, as transformers documents for compiled decoding;
* ``cuvil``: ``cu.compile(model)`` on ``cu.quantize(model, precision)`` for bf16 / int8 /
  int4 / int4-a8 (group ``--group-size``), the fp32 model otherwise, static cache;
* ``onnxruntime-genai`` and ``llama.cpp`` where they install: the same weights saved with
  ``save_pretrained`` (and a tokenizer trained here, ``benchmarks.llm_tokenizer``), exported
  with each one's own converter, decoded with each one's own loop (``benchmarks.llm_peers``);
  a peer that is missing or fails gets a row saying why.

Every child times the same thing (``llm_peers.measure``): the same prompts (numpy, seeded),
greedy, exactly ``--new-tokens`` new tokens; its batch-1 tokens are compared with eager fp32's.

The machine this runs on is shared and noisy: every number comes with the host, its ISA,
the threads, and the bound measured in the same run; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.generate import llama
from benchmarks.llm_peers import GGUF_PRECISIONS, PEERS, PeerUnavailable, measure, prompt
from benchmarks.roofline import host_info

SIZES: dict[str, dict[str, int]] = {
    # the LLM-speed issue's decoder (123 MB of fp32 weights)
    "issue": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 2, "ffn": 1408, "vocab": 8000},
    # about 1 GB of fp32 weights
    "1gb": {"hidden": 1536, "layers": 10, "heads": 12, "kv_heads": 4, "ffn": 4096, "vocab": 32000},
}
IMPLS = ("eager", "torch.compile", "cuvil", *PEERS)
PRECISIONS = ("fp32", "bf16", "int8", "int4", "int4-a8")


def build(size: str) -> Any:
    return llama(SIZES[size], max_positions=2048, tie_word_embeddings=False)


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
            else:  # int4, int4-a8: two per byte, a scale and a zero point per group
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
    if precision in ("int8", "int4", "int4-a8"):
        try:
            from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
            from torchao.quantization import (
                Int8DynamicActivationIntxWeightConfig,
                Int8WeightOnlyConfig,
                quantize_,
            )
            from torchao.quantization.granularity import PerGroup
        except ImportError as e:
            raise SystemExit(f"skipped: torchao is not installed ({e})") from None
        # torchao 0.18's CPU int4 weight-only path: Int4WeightOnlyConfig needs the mslk
        # package (CUDA kernels) for every packing; the prototype config packs for
        # torch's _weight_int4pack_mm_for_cpu (docs/quantization.md, torchao). int4-a8's
        # counterpart: torchao's 8da4w (int4 weights per group, activations rounded to int8
        # per token at run time: a coarser rounding than int4-a8's blocks of 32)
        if precision == "int8":
            config: Any = Int8WeightOnlyConfig()
        elif precision == "int4":
            config = PrototypeInt4WeightOnlyConfig(group_size=group_size)
        else:
            config = Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int4, weight_granularity=PerGroup(group_size)
            )
        quantize_(model, config)
    return model


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

    def run(ids: Any, n: int) -> Any:
        x = torch.from_numpy(ids)
        with torch.no_grad():
            return generate(x, max_new_tokens=n, min_new_tokens=n, **kw)[:, x.shape[1] :].numpy()

    out: dict[str, Any] = {"impl": impl, "precision": precision, "size": size}
    out.update(measure(run, args, vocab, time.perf_counter()))
    if run_model is not None:
        out["compiles"] = run_model.stats.compiles
        out["fallbacks"] = run_model.stats.fallbacks
    return out


def _bound_gbps(data: dict[str, Any]) -> float:
    """The bound's rate: the larger ``torch.mv`` rate of the two measured (at the start and the
    end of the run). On a shared host a busy spell depresses one of them; the larger is the
    nearer to what the memory delivers, and gives the smaller, more conservative fractions."""
    return max(data["rates"]["mv_gbps"], data.get("rates_after", {}).get("mv_gbps", 0.0))


def _row_cells(r: dict[str, Any], data: dict[str, Any], batches: list[str], prompts: list[str]) -> list[str]:
    c = data["config"]
    wb = r.get("weight_bytes") or data["weight_bytes"][r["precision"]]
    bound = _bound_gbps(data) * 1e9 / wb
    bits = 8 * wb / data["streamed_params"]
    row = [r["precision"], r["impl"], f"{wb / 1e6:.1f}", f"{bits:.2f}", f"{bound:.0f}"]
    if "error" in r:
        return [*row, r["error"][:160]]
    dec = r["decode_tokens_per_s"]
    row += [f"{dec[b]:.1f}" for b in batches]
    row += [f"{dec['1'] / bound:.2f}" if "1" in dec else ""]
    row += [f"{r['ttft_s'][p]:.3f}" for p in prompts]
    ref, got = data["reference_tokens"], r.get("tokens", [])
    same = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    row += [f"{r['first_generate_s']:.1f}", f"{r['peak_rss_mb']:.0f}", f"{same}/{c['new_tokens']}"]
    row += [str(r.get("compiles", "")), str(r.get("load", ""))]
    return row


def _markdown(data: dict[str, Any]) -> str:
    c = data["config"]
    rates = data["rates"]
    h = data["host"]
    lines = [
        f"# LLM decode and prefill on CPU ({c['size']}: {SIZES[c['size']]})",
        "",
        f"Host: {h['cpu']}, {h['cores']} cores, ISA {h['isa']}, load average {data['load_before']} before "
        f"the run; torch {h['torch']}; {c['threads']} threads; prompt {c['prompt']}, {c['new_tokens']} new "
        f"tokens (greedy), median of {c['repeats']}; Cuvil target {c['target']}, int4 group "
        f"{c['group_size']}; peers: {data['peer_versions'] or 'none'}.",
        f"Streaming rates in this run ({c['stream_mib']} MiB f32), at its start: torch.mv "
        f"{rates['mv_gbps']:.1f} GB/s, copy {rates['copy_gbps']:.1f} GB/s (read + write), sum "
        f"{rates['sum_gbps']:.1f} GB/s"
        + (
            "; at its end (load {load:.2f}): torch.mv {mv_gbps:.1f}, copy {copy_gbps:.1f}, sum "
            "{sum_gbps:.1f} GB/s".format(**data["rates_after"])
            if "rates_after" in data
            else ""
        )
        + f". The bound uses the larger torch.mv rate, {_bound_gbps(data):.1f} GB/s.",
        f"Command: `{c['command']}`",
        "",
        "weights MB: what a decode step streams in that row's format (every linear, the lm_head "
        "included, with its scales; not the token embedding); bits/w: those bytes per weight; "
        "bound: torch.mv's rate / those bytes; fraction: decode b1 / bound. TTFT: batch 1, "
        "1 new token. first s: the first generate() (torch: compile included; peers: model load "
        "included). RSS: the child's VmHWM. = eager: greedy tokens of the batch-1 prompt equal "
        "to eager fp32's, as a prefix (quantized formats differ by design: random weights give "
        "near-flat logits). load: the host's 1-minute load average as the row ended.",
        "",
    ]
    batches = [str(b) for b in c["batches"]]
    prompts = [str(p) for p in c["ttft_prompts"]]
    head = (
        ["precision", "impl", "weights MB", "bits/w", "bound tok/s"]
        + [f"decode tok/s b{b}" for b in batches]
        + ["fraction of bound (b1)"]
        + [f"TTFT {p} s" for p in prompts]
        + ["first s", "peak RSS MB", "= eager fp32", "compiles", "load"]
    )
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data["results"]:
        lines.append("| " + " | ".join(_row_cells(r, data, batches, prompts)) + " |")
    return "\n".join(lines) + "\n"


def _run_child(cmd: list[str], env: dict[str, str], timeout: int, impl: str, prec: str) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "precision": prec, "error": "timed out"}
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        return {"impl": impl, "precision": prec, "error": lines[-1] if lines else "no output"}
    return {"impl": impl, "precision": prec, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _peer_row(impl: str, prec: str, hf: Path | None, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Export the model for the peer (once per format) and time it in a child of its own."""
    from benchmarks.llm_peers import prepare_gguf, prepare_ort

    try:
        if hf is None:
            raise PeerUnavailable("the model could not be saved for export (see the log)")
        if impl == "onnxruntime-genai":
            artifact, wb = prepare_ort(hf, prec, work / f"ort-{prec}", args.threads, args.child_timeout)
        else:
            artifact, wb = prepare_gguf(hf, prec, work, args.llama_cpp_src, args.threads, args.child_timeout)
    except PeerUnavailable as e:
        return {"impl": impl, "precision": prec, "error": f"not run: {e}"}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    child_args = {k: v for k, v in vars(args).items() if k != "child"}
    cmd = [sys.executable, "-m", "benchmarks.llm_peers", impl, prec, str(artifact), json.dumps(child_args)]
    row = _run_child(cmd, env, args.child_timeout, impl, prec)
    row["weight_bytes"] = wb
    row["format"] = {"onnxruntime-genai": "builder -p " + prec, "llama.cpp": GGUF_PRECISIONS[prec]}[impl]
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="issue")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of {', '.join(IMPLS)}")
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
    p.add_argument(
        "--llama-cpp-src",
        default=os.environ.get("LLAMA_CPP_SRC"),
        help="llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py), e.g. the llama-cpp-python "
        "sdist's vendor/llama.cpp; default $LLAMA_CPP_SRC",
    )
    p.add_argument("--quick", action="store_true", help="batch 1, a 128-token TTFT prompt, 1 repeat")
    p.add_argument("--out", default="benchmarks/results/llm")
    p.add_argument("--name", default="latest", help="the results' file name: NAME.md and NAME.json")
    p.add_argument("--render", metavar="JSON", help="only write NAME.md again from a run's JSON")
    p.add_argument("--child", nargs=2, metavar=("IMPL", "PRECISION"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        Path(args.render).with_suffix(".md").write_text(_markdown(data))
        return
    if args.quick:
        args.batches, args.ttft_prompts, args.repeats = "1", "128", 1
    args.batches = [int(b) for b in str(args.batches).split(",")]
    args.ttft_prompts = [int(n) for n in str(args.ttft_prompts).split(",")]
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args)))
        return
    impls = args.impls.split(",")
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        p.error(f"unknown --impls {unknown}; choose from {', '.join(IMPLS)}")
    load_before = os.getloadavg()
    rates = _stream_rates(args.stream_mib, args.threads)
    print("streaming rates:", rates, flush=True)
    model = build(args.size)
    precisions = args.precisions.split(",")
    wbytes = {prec: weight_bytes(model, prec, args.group_size) for prec in PRECISIONS}
    vocab = SIZES[args.size]["vocab"]
    with torch.no_grad():
        ids = torch.from_numpy(prompt(vocab, 1, args.prompt, 1))
        n = args.new_tokens
        ref = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, args.prompt :]
    work = Path(tempfile.mkdtemp(prefix="cuvil-llm-"))
    hf: Path | None = None
    if any(i in PEERS for i in impls):
        from benchmarks.llm_peers import save_hf

        try:
            hf = save_hf(model, work / "hf", vocab)
        except Exception as e:  # a peer row says why; the torch rows still run
            print(f"could not save the model for the peers: {e!r}", flush=True)
    del model
    results: list[dict[str, Any]] = []
    data = {
        "host": host_info(),
        "load_before": " ".join(f"{x:.2f}" for x in load_before),
        "peer_versions": "",
        "config": {
            **{k: v for k, v in vars(args).items() if k != "child"},
            "command": " ".join(["python -m benchmarks.llm", *(argv or sys.argv[1:])]),
        },
        "rates": rates,
        "weight_bytes": wbytes,
        "streamed_params": wbytes["fp32"] // 4,
        "reference_tokens": [int(t) for t in ref],
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for prec in precisions:
            for impl in impls:
                if impl in PEERS:
                    results.append(_peer_row(impl, prec, hf, work, args))
                else:
                    with tempfile.TemporaryDirectory() as tmp:
                        env = {
                            **os.environ,
                            "CUVIL_CACHE_DIR": f"{tmp}/cuvil",
                            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
                            "OMP_NUM_THREADS": str(args.threads),
                        }
                        cmd = [sys.executable, "-m", "benchmarks.llm", *(argv or sys.argv[1:])]
                        results.append(
                            _run_child([*cmd, "--child", impl, prec], env, args.child_timeout, impl, prec)
                        )
                # the host's 1-minute load average as the row finished: on a shared host the
                # rows of one run can see different loads
                results[-1]["load"] = round(os.getloadavg()[0], 2)
                print(json.dumps(results[-1]), flush=True)
                # written after every row, so an interrupted run keeps what it measured
                versions = {r["impl"]: r["version"] for r in results if "version" in r}
                data["peer_versions"] = ", ".join(f"{k} {v}" for k, v in versions.items())
                (out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
                (out / f"{args.name}.md").write_text(_markdown(data))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data["rates_after"] = {**_stream_rates(args.stream_mib, args.threads), "load": os.getloadavg()[0]}
    (out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(_markdown(data))
    print(_markdown(data))


if __name__ == "__main__":
    main()
