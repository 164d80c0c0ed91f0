"""Float32 linears: MKL (``F.linear``), oneDNN and our packed GEMM, per shape and in whole models.

    PYTHONPATH=. python -m benchmarks.gemm                          # the zoo's linear shapes
    PYTHONPATH=. python -m benchmarks.gemm --threads 1 --interleaved
    PYTHONPATH=. python -m benchmarks.gemm --zoo bert t5 clip_text vit distilbert
    PYTHONPATH=. python -m benchmarks.gemm --serve-step 16 --calls 40 --threads 1

Per shape (``M x K -> N``, with bias): each GEMM called ``--calls`` times in a row (its weight
warm in cache), or with ``--interleaved`` the three taking turns call by call (as the GEMM choice
measures them: each then finds its weight colder), medians in µs and GFLOP/s, and the largest
difference from a float64 product. ``--zoo``: the compiled zoo model called with
``CUVIL_CPU_GEMM`` switched between ``mkl``, ``onednn``, ``packed`` and unset (the per-shape
choice) call by call, in one process, medians in ms; the choice record is the kernel cache's
(delete ``gemm-*.json`` there to measure afresh). ``--serve-step N``: the same for
cuvil-serve's compiled decode step of N sequences. Host, ISA and threads head the output.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

#: (M, K, N): the zoo's linears (BERT/CLIP/T5 at d 256, FFN 1024; ViT's 197 tokens, 788 at batch
#: 4), a decode batch of 16 (serving), and ragged sizes
SHAPES = [
    (16, 512, 512),
    (16, 512, 1408),
    (32, 256, 256),
    (32, 1024, 256),
    (77, 256, 1024),
    (128, 256, 256),
    (128, 256, 1024),
    (128, 1024, 256),
    (197, 1024, 256),
    (512, 256, 1024),
    (788, 256, 1024),
    (788, 1024, 256),
    (7, 100, 37),
]


def _times(fns: dict[str, Callable[[], Any]], calls: int, interleaved: bool) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    order = [(n, f) for _ in range(calls) for n, f in fns.items()] if interleaved else None
    if order is None:
        order = [(n, f) for n, f in fns.items() for _ in range(calls)]
    for name, fn in order:
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def shapes(calls: int, interleaved: bool) -> None:
    from cuvil_backend_cpu import externs, packed_gemm
    from cuvil_backend_cpu.kernel_cache import KernelCache

    pk = packed_gemm.f32_linear(KernelCache())
    print(
        "| M x K -> N | MKL µs | oneDNN µs | packed µs | MKL GFLOP/s | oneDNN | packed | packed max error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m, k, n in SHAPES:
        g = torch.Generator().manual_seed(m + k + n)
        x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        fns: dict[str, Callable[[], Any]] = {
            "mkl": lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b),
            "onednn": lambda x=x, w=w, b=b, m=m: externs._onednn_linear(x, w, b, m),
            "packed": lambda x=x, w=w, b=b: pk(x, w, b),
        }
        t = _times(fns, calls, interleaved)
        got = pk(x, w, b)
        assert got is not None
        want = torch.nn.functional.linear(x.double(), w.double(), b.double())
        err = (got.double() - want).abs().max().item()
        flops = 2 * m * k * n
        cells = [f"{t[c] * 1e6:.1f}" for c in fns] + [f"{flops / t[c] / 1e9:.0f}" for c in fns]
        print(f"| {m} x {k} -> {n} | " + " | ".join(cells) + f" | {err:.1e} |", flush=True)


def zoo(models: list[str], rounds: int, batch: int) -> None:
    import cuvil as cu
    from benchmarks.workloads import WORKLOADS
    from cuvil_backend_cpu import gemm_choice

    modes = ["mkl", "onednn", "packed", ""]
    print("| model | MKL ms | oneDNN ms | packed ms | chosen ms | MKL / packed | oneDNN / packed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in models:
        wl = WORKLOADS[f"zoo_{name}"]
        model, args = wl.build_fn(), wl.inputs(batch)
        compiled = cu.compile(model, target="cpu")
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        with torch.no_grad():
            for r in range(rounds + 3):
                for mode in modes:
                    os.environ[gemm_choice.GEMM_ENV] = mode
                    t0 = time.perf_counter()
                    compiled(*args)
                    if r >= 3:
                        times[mode].append(time.perf_counter() - t0)
        os.environ.pop(gemm_choice.GEMM_ENV, None)
        med = {mode: statistics.median(t) * 1e3 for mode, t in times.items()}
        print(
            f"| {name} | {med['mkl']:.2f} | {med['onednn']:.2f} | {med['packed']:.2f} | {med['']:.2f} | "
            f"{med['mkl'] / med['packed']:.2f} | {med['onednn'] / med['packed']:.2f} |",
            flush=True,
        )


def serve_step(rounds: int, sequences: int) -> None:
    """cuvil-serve's compiled decode step of ``sequences`` sequences (small-llama, 64-token
    prompts), ``CUVIL_CPU_GEMM`` switched step by step as in :func:`zoo`."""
    import random

    from cuvil_backend_cpu import gemm_choice
    from cuvil_serve.engine import Engine, EngineConfig
    from cuvil_serve.models import build_model
    from cuvil_serve.sampling import SamplingParams

    loaded = build_model("small-llama")
    engine = Engine(loaded, EngineConfig(compile=True, num_blocks=1024))
    rng = random.Random(0)
    for _ in range(sequences):
        prompt = [rng.randrange(3, loaded.tokenizer.vocab_size) for _ in range(64)]
        engine.add_request(prompt, SamplingParams(max_tokens=900, temperature=0, ignore_eos=True))
    while engine.scheduler.waiting or any(
        s.num_computed < len(s.token_ids) - 1 for s in engine.scheduler.running
    ):
        engine.step()  # the prompts' prefill: every later step decodes all of them
    modes = ["mkl", "onednn", "packed", ""]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(rounds + 3):
        for mode in modes:
            os.environ[gemm_choice.GEMM_ENV] = mode
            t0 = time.perf_counter()
            engine.step()
            if r >= 3:
                times[mode].append(time.perf_counter() - t0)
    os.environ.pop(gemm_choice.GEMM_ENV, None)
    med = {mode or "chosen": f"{statistics.median(t) * 1e3:.2f}" for mode, t in times.items()}
    print(f"decode step of {sequences} sequences, ms (MKL, oneDNN, packed, chosen): {med}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=30, help="calls per GEMM and shape (rounds with --zoo)")
    p.add_argument("--interleaved", action="store_true", help="the GEMMs take turns call by call")
    p.add_argument("--zoo", nargs="*", help="zoo models: whole-model A/B instead of shapes")
    p.add_argument("--batch", type=int, default=1, help="--zoo: the models' batch")
    p.add_argument("--serve-step", type=int, metavar="SEQUENCES", help="cuvil-serve's decode step instead")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from cuvil_backend_cpu.toolchain import find_toolchain

    print(
        f"host: {platform.machine()}, {os.cpu_count()} CPUs, cpu target ISA {find_toolchain().isa}, "
        f"{a.threads} threads, torch {torch.__version__}\n"
    )
    if a.serve_step:
        serve_step(a.calls, a.serve_step)
    elif a.zoo is not None:
        zoo(a.zoo or ["bert", "t5", "clip_text", "vit", "distilbert"], a.calls, a.batch)
    else:
        shapes(a.calls, a.interleaved)


if __name__ == "__main__":
    main()
