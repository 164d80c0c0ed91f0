"""The ``cpu`` target's attention kernel against torch's CPU ``scaled_dot_product_attention``.

    python -m benchmarks.attention                      # from the repo root, in a dev venv
    python -m benchmarks.attention --threads 2 --repeats 31 --shapes whisper bert
    python -m benchmarks.attention --blocks 48x128 96x128   # block sizes to compare

Per shape, the two implementations run interleaved in one process (A B A B ...), so
load from other processes hits both alike; it prints the median time of each, the
ratio torch / ours (above 1: ours is faster) and a roofline: the time of the same
two products as batched GEMMs (``torch.bmm``, scores materialized) and of copying
q, k, v and the output once (``clone``), whichever is larger.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cuvil_backend_cpu.attention import FlashAttention
from cuvil_backend_cpu.kernel_cache import KernelCache


@dataclass(frozen=True)
class Shape:
    name: str
    b: int
    h: int
    l: int  # noqa: E741 - the usual name of the query length
    s: int
    e: int
    causal: bool = False
    mask: bool = False  # a (B, 1, 1, S) additive padding mask, as BERT's

    def inputs(self) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        # q, k, v as transformers makes them: a linear's output (B, L, H, E) transposed to (B, H, L, E)
        q = torch.randn(self.b, self.l, self.h, self.e, generator=g).transpose(1, 2)
        k = torch.randn(self.b, self.s, self.h, self.e, generator=g).transpose(1, 2)
        v = torch.randn(self.b, self.s, self.h, self.e, generator=g).transpose(1, 2)
        return q, k, v


SHAPES = {
    s.name: s
    for s in (
        Shape("whisper", 1, 6, 1500, 1500, 64),
        Shape("bert", 1, 4, 128, 128, 64, mask=True),
        Shape("gpt2", 1, 12, 128, 128, 64, causal=True),
        Shape("decode", 1, 12, 1, 512, 64),
    )
}


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, inner: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_time(lambda fn=fn: [fn() for _ in range(inner)]) / inner)
    return {n: statistics.median(t) for n, t in times.items()}


def roofline(shape: Shape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, repeats: int) -> float:
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    flat = (shape.b * shape.h, shape.l, shape.e)
    q3, k3, v3 = qc.view(flat), kc.view(shape.b * shape.h, shape.s, shape.e), vc.reshape(-1, shape.s, shape.e)
    scores = torch.empty(shape.b * shape.h, shape.l, shape.s)
    out = torch.empty(shape.b * shape.h, shape.l, shape.e)

    def gemms() -> None:
        torch.bmm(q3, k3.transpose(1, 2), out=scores)
        torch.bmm(scores, v3, out=out)

    def copies() -> None:
        for t in (qc, kc, vc, out):
            t.clone()

    times = interleaved({"gemm": gemms, "copy": copies}, repeats, inner=1)
    return max(times.values())


def compare(shape: Shape, variants: dict[str, FlashAttention], repeats: int) -> None:
    """One line of the table: torch's time, each variant's, the ratio and the roofline."""
    q, k, v = shape.inputs()
    mask = torch.zeros(shape.b, 1, 1, shape.s) if shape.mask else None
    if mask is not None:
        mask[..., -shape.s // 4 :] = float("-inf")  # padding at the end of each sequence
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=shape.causal)
    fns: dict[str, Callable[[], Any]] = {
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=shape.causal)
    }
    for name, fa in variants.items():
        got = fa(q, k, v, mask, is_causal=shape.causal)
        assert got is not None and torch.allclose(got, want, atol=1e-5, rtol=1e-4), name
        fns[name] = lambda fa=fa: fa(q, k, v, mask, is_causal=shape.causal)
    inner = max(1, int(2e-3 / max(_time(fns["torch"]), 1e-7)))
    times = interleaved(fns, repeats, inner)
    roof = roofline(shape, q, k, v, repeats)
    ours = " ".join(f"{times[n] * 1e3:>14.4f}" for n in variants)
    print(
        f"{shape.name:<9} {times['torch'] * 1e3:>9.4f} {ours} "
        f"{times['torch'] / times['ours']:>10.2f} {roof * 1e3:>11.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--blocks", nargs="*", default=[], help="BQxBK block sizes to time as well")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flash = FlashAttention(KernelCache())
    variants = {"ours": flash}
    for spec in args.blocks:
        other = FlashAttention(KernelCache())
        other.block_q, other.block_k = (int(x) for x in spec.split("x"))
        variants[f"ours {spec}"] = other
    print(f"threads {args.threads}, median of {args.repeats}, ours {flash.block_q}x{flash.block_k}")
    print(f"{'shape':<9} {'torch ms':>9} " + " ".join(f"{n + ' ms':>14}" for n in variants), end="")
    print(f" {'torch/ours':>10} {'roofline ms':>11}")
    with torch.no_grad():
        for name in args.shapes:
            compare(SHAPES[name], variants, args.repeats)


if __name__ == "__main__":
    main()
