"""Weight-only low-precision linears (``weight_only_linear``) against torch, at decode shapes.

    python -m benchmarks.quant_linear                        # from the repo root, in a dev venv
    python -m benchmarks.quant_linear --threads 2 --repeats 41 --rows 1 4 16
    CUVIL_CPU_ISA=avx2 python -m benchmarks.quant_linear      # the AVX2 kernels on an AVX-512 host

Per shape (``M`` rows of activations, a ``K -> N`` linear), every implementation runs
interleaved in one process (A B C ... A B C ...), so load from other processes hits all alike;
the table gives the median time of one call and, for each, its *weight-streaming bound*: the
bytes of its weights (packed codes, scales and zero points) divided by the rate ``torch.mv``
streams a float32 matrix of at least 256 MiB, timed in the same run (its median), and the
fraction of that bound reached (1.0 = at the bound). Implementations:

- ``fp32 torch``: ``F.linear`` on float32 weights (MKL or oneDNN, torch's choice);
- ``bf16 torch``: ``F.linear`` on bfloat16 activations and weights (torch's own);
- ``int8 aten`` / ``int4 aten``: torch's CPU weight-only kernels (``_weight_int8pack_mm``,
  ``_weight_int4pack_mm_for_cpu``: what torchao calls on CPU), where this torch has them;
- ``bf16 / int8 / int4 cuvil``: the cpu target's ``weight_only_linear`` as compiled code calls it
  (the out-variant: Python checks, ctypes, the kernel; int4 with ``--group`` values a group).

Results as Markdown on stdout (and ``--out file.md``), with the host's CPU, ISA and threads.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_backend_cpu import quant_linear, toolchain
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_ir.graph_ir.ops.quant import pack_int4

#: (name, K, N): decode-shaped linears (Llama-7B's MLP is 4096 -> 11008)
SHAPES = {"2048": (2048, 2048), "4096": (4096, 4096), "mlp": (4096, 11008)}


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, inner: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - t0) / inner)
    return {n: statistics.median(t) for n, t in times.items()}


def mv_stream(nbytes: int = 256 << 20) -> tuple[Callable[[], Any], int]:
    """``torch.mv`` over a float32 matrix of ``nbytes``: the call, and the bytes it streams."""
    cols = 4096
    a = torch.randn(nbytes // 4 // cols, cols)
    v = torch.randn(cols)
    return (lambda: torch.mv(a, v)), a.numel() * 4


def other_streams(nbytes: int = 256 << 20) -> dict[str, tuple[Callable[[], Any], int]]:
    """Reduction and copy over ``nbytes`` of float32 (bytes read; a copy also writes them),
    timed beside ``torch.mv`` as other views of the same bandwidth."""
    a = torch.randn(nbytes // 4)
    b = torch.empty_like(a)
    return {"sum stream": ((lambda: a.sum()), nbytes), "copy stream": ((lambda: b.copy_(a)), 2 * nbytes)}


def weights(k: int, n: int, group: int, gen: torch.Generator) -> dict[str, Any]:
    """Each format's weight (quantized from one random float32 weight) and its byte count."""
    w = torch.randn(n, k, generator=gen) * 0.02
    out: dict[str, Any] = {"fp32": (w, n * k * 4), "bf16": (w.bfloat16(), n * k * 2)}
    s8 = w.abs().amax(1).clamp(min=1e-8) / 127
    q8 = torch.round(w / s8[:, None]).clamp(-128, 127).to(torch.int8)
    out["int8"] = ((q8, s8), n * k + n * 4)
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    s4 = ((hi - lo) / 15).clamp(min=1e-6)
    z4 = lo + 8 * s4
    q4 = torch.round((g - lo[..., None]) / s4[..., None]).clamp(0, 15).reshape(n, k)
    out["int4"] = ((pack_int4(q4), s4, z4, q4.to(torch.int32)), n * k // 2 + 2 * (n * k // group) * 4)
    return out


def aten_int8(x: torch.Tensor, q8: torch.Tensor, s8: torch.Tensor) -> Callable[[], Any] | None:
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return None
    try:
        op(x, q8, s8)
    except RuntimeError:
        return None
    return lambda: op(x, q8, s8)


def aten_int4(x: torch.Tensor, q4: torch.Tensor, s4: torch.Tensor, z4: torch.Tensor, group: int) -> Any:
    pack = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
    mm = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
    if pack is None or mm is None:
        return None
    try:
        packed = pack(q4, 1)
        sz = torch.stack([s4.t(), z4.t()], dim=-1).contiguous()  # tinygemm's [K/G, N, 2]
        mm(x, packed, group, sz)
    except RuntimeError:
        return None
    return lambda: mm(x, packed, group, sz)


def rotating(make: Callable[[], Callable[[], Any]], nbytes: int, working_set: int) -> Callable[[], Any]:
    """A call that cycles through enough copies of its weights (``make()`` builds one call on its own
    copy) that they add up to ``working_set`` bytes: a weight read again is then out of the last-level
    cache, as in a model whose layers' weights together exceed it."""
    calls = [make() for _ in range(max(1, -(-working_set // nbytes)))]
    state = {"i": 0}

    def call() -> Any:
        i = state["i"]
        state["i"] = (i + 1) % len(calls)
        return calls[i]()

    return call


def implementations(
    kern: Callable[..., Any], x: torch.Tensor, out: torch.Tensor, ws: dict[str, Any], group: int
) -> dict[str, Callable[[], Callable[[], Any] | None]]:
    """Per implementation, a function making one call of it on its own copy of the weights
    (``None``: this torch lacks that aten kernel)."""
    xb = x.bfloat16()
    q8, s8 = ws["int8"][0]
    p4, s4, z4, q4 = ws["int4"][0]

    def fp32() -> Callable[[], Any]:
        w = ws["fp32"][0].clone()
        return lambda: F.linear(x, w)

    def bf16() -> Callable[[], Any]:
        w = ws["bf16"][0].clone()
        return lambda: F.linear(xb, w)

    def ours(fmt: str, *tensors: torch.Tensor, group_size: int = 0) -> Callable[[], Callable[[], Any]]:
        def make() -> Callable[[], Any]:
            copies = [t.clone() for t in tensors]
            return lambda: kern(out, x, *copies, fmt=fmt, group_size=group_size, has_bias=False)

        return make

    return {
        "fp32 torch": fp32,
        "bf16 torch": bf16,
        "int8 aten": lambda: aten_int8(x, q8.clone(), s8.clone()),
        "int4 aten": lambda: aten_int4(x, q4, s4, z4, group),
        "bf16 cuvil": ours("bf16", ws["bf16"][0]),
        "int8 cuvil": ours("int8", q8, s8),
        "int4 cuvil": ours("int4", p4, s4, z4, group_size=group),
        "int4-a8 cuvil": ours("int4-a8", p4, s4, z4, group_size=group),
    }


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    kern = quant_linear.out_variant(KernelCache())
    ql = quant_linear.kernel(KernelCache())
    mv, mv_bytes = mv_stream()
    streams = other_streams()
    tc = toolchain.find_toolchain()
    ws_bytes = args.working_set << 20
    lines = [
        f"host: {toolchain.cpuinfo().get('model name', platform.processor())}, "
        f"kernels built for {tc.isa} ({' '.join(tc.flags[1:2])}; {ql.lanes} float lanes, "
        f"tiles of {ql.tile_rows} x {ql.tile_cols} rows), {args.threads} threads, torch {torch.__version__}; "
        f"weights cycled through copies of >= {args.working_set} MiB; int4 group {args.group}",
        "",
        "| shape (M x K -> N) | implementation | ms | weight MB | weight GB/s | bound ms | fraction of bound |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for shape in args.shapes:
        k, n = SHAPES[shape]
        ws = weights(k, n, args.group, gen)
        for m in args.rows:
            x = torch.randn(m, k, generator=gen)
            out = torch.empty(m, n)
            makers = implementations(kern, x, out, ws, args.group)
            fns: dict[str, Callable[[], Any]] = {"mv stream": mv, **{k: f for k, (f, _) in streams.items()}}
            nbytes: dict[str, int] = {}
            for name, make in makers.items():
                if args.skip_aten and "aten" in name:
                    continue
                if make() is None:
                    continue  # (this torch lacks the aten kernel)
                fmt = name.split()[0]
                nbytes[name] = ws["int4" if fmt == "int4-a8" else fmt][1]  # (int4's weights)
                fns[name] = rotating(make, nbytes[name], ws_bytes)  # type: ignore[arg-type]
            times = interleaved(fns, args.repeats, args.inner)
            rate = mv_bytes / times["mv stream"]
            lines.append(
                f"| {m} x {k} -> {n} | torch.mv stream (the bound's rate) | | | {rate / 1e9:.1f} | | |"
            )
            for name, (_, sb) in streams.items():
                lines.append(
                    f"| {m} x {k} -> {n} | {name} (for comparison) | | | {sb / times[name] / 1e9:.1f} | | |"
                )
            for name, t in times.items():
                if name not in nbytes:
                    continue
                b = nbytes[name] / rate
                lines.append(
                    f"| {m} x {k} -> {n} | {name} | {t * 1e3:.3f} | {nbytes[name] / 1e6:.1f} | "
                    f"{nbytes[name] / t / 1e9:.1f} | {b * 1e3:.3f} | {b / t:.2f} |"
                )
            del fns
    return "\n".join(lines)


# -- a model: accuracy against float32, and decode speed -------------------------------------------


def llama(size: str) -> Any:
    """A Llama-style decoder from a config, random weights (seeded): ``issue`` is the LLM-speed
    issue's 123 MB model (d 512, 8 layers, 8 / 2 heads, FFN 1408, vocab 8000), ``small`` a quick one."""
    import transformers as T

    torch.manual_seed(0)
    dims = {"issue": (512, 8, 8, 2, 1408, 8000), "small": (256, 2, 4, 2, 768, 2000)}[size]
    d, layers, heads, kv, ffn, vocab = dims
    cfg = T.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=512,
    )
    return T.LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def model_report(args: argparse.Namespace) -> str:
    """Per format: the logit error against float32 on a prompt, greedy agreement with float32 over
    ``--new-tokens`` tokens (eager), and decode tokens/s of ``cu.compile(model).generate`` at batch
    1 against eager float32 (interleaved, medians)."""
    import copy

    import cuvil as cu

    torch.set_num_threads(args.threads)
    fp32 = llama(args.model)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, fp32.config.vocab_size, (1, 32), generator=gen)
    kw: dict[str, Any] = {
        "max_new_tokens": args.new_tokens,
        "do_sample": False,
        "min_new_tokens": args.new_tokens,
    }
    ref_logits = fp32(prompt).logits
    ref_tokens = fp32.generate(prompt, **kw)[0, prompt.shape[1] :]
    lines = [
        f"model: Llama from config ({args.model}), {sum(p.numel() for p in fp32.parameters()) * 4 / 1e6:.0f} MB "
        f"of fp32 weights; prompt 32 tokens; {args.threads} threads; int4 group {args.group}",
        "",
        "| format | linear weight MB | max abs logit error | (relative to max logit) | mean abs error "
        "| top-1 agreement, prompt | greedy tokens equal to fp32 | first divergence | decode tok/s (cuvil) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    models: dict[str, Any] = {"fp32": fp32}
    for fmt in ("bf16", "int8", "int4", "int4-a8"):
        models[fmt] = cu.quantize(copy.deepcopy(fp32), fmt, group_size=args.group)
    compiled = {name: cu.compile(m, target="cpu", fallback="error") for name, m in models.items()}
    short = {**kw, "max_new_tokens": args.decode_tokens, "min_new_tokens": args.decode_tokens}
    for c in compiled.values():
        c.generate(prompt, **short)  # compile the prompt and the step
    calls = {name: (lambda c=c: c.generate(prompt, **short)) for name, c in compiled.items()}
    calls["fp32 eager"] = lambda: fp32.generate(prompt, **short)
    times = interleaved(calls, args.repeats, 1)
    for name, m in models.items():
        logits = m(prompt).logits
        err = (logits - ref_logits).abs()
        top1 = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
        tokens = m.generate(prompt, **kw)[0, prompt.shape[1] :]
        same = tokens == ref_tokens
        first = int((~same).nonzero()[0]) if not bool(same.all()) else len(same)
        wbytes = sum(
            sum(t.numel() * t.element_size() for t in (mod.weight, mod.scales, mod.zeros) if t is not None)
            if isinstance(mod, cu.QuantizedLinear)
            else mod.weight.numel() * 4
            for mod in m.modules()
            if isinstance(mod, (torch.nn.Linear, cu.QuantizedLinear))
        )
        lines.append(
            f"| {name} | {wbytes / 1e6:.1f} | {err.max().item():.4f} | {err.max().item() / ref_logits.abs().max().item():.4f} "
            f"| {err.mean().item():.5f} | {top1:.3f} | {int(same.sum())}/{len(same)} | {first} "
            f"| {args.decode_tokens / times[name]:.1f} |"
        )
    lines.append("")
    lines.append(
        f"eager fp32 decode: {args.decode_tokens / times['fp32 eager']:.1f} tok/s ({args.decode_tokens} new tokens a call, median of {args.repeats})"
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--inner", type=int, default=5, help="calls per timed sample")
    p.add_argument("--rows", type=int, nargs="+", default=[1])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--group", type=int, default=128, help="int4 group size")
    p.add_argument(
        "--working-set", type=int, default=256, help="MiB of weight copies each implementation cycles through"
    )
    p.add_argument(
        "--skip-aten", action="store_true", help="leave out torch's int8/int4 kernels (slow at many rows)"
    )
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument(
        "--model", choices=["issue", "small"], help="instead: a Llama from config, accuracy and decode"
    )
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens compared with fp32 (--model)")
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens a timed generate() makes (--model)")
    args = p.parse_args()
    text = model_report(args) if args.model else run(args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
