"""Cuvil demo: compile functions and a module on the cpu target (the default target
when cpu is not available), check them against eager PyTorch, show what was
captured, and time eager against Cuvil.

    nox -s demo          (or: python examples/demo.py)
"""

from __future__ import annotations

import time

import torch

import cuvil as cu


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 66 - len(title)))


def pick_target() -> str | None:
    """``"cpu"`` when that target is usable here, else ``None`` (the default target)."""
    cpu = {b.name: b for b in cu.backends()}.get("cpu")
    if cpu is not None and cpu.available:
        print("  compiling for the cpu target")
        return "cpu"
    why = "is not installed (pip install 'cuvil[cpu]')" if cpu is None else "is unavailable (see above)"
    print(f"  the cpu target {why}: compiling for the default target instead")
    return None


def median_ms(fn, *args, repeat: int = 50) -> float:
    for _ in range(3):  # warm-up
        fn(*args)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


@torch.no_grad()  # inference, as Cuvil compiles it: eager is timed without autograd too
def main() -> None:
    torch.manual_seed(0)
    section("targets (cuvil backends)")
    for b in cu.backends():
        state = "available" if b.available else f"unavailable: {b.reason}"
        print(f"  {b.name:<12} {state}")
    target = pick_target()

    section("a function")

    @cu.compile(target=target)
    def f(x, y):
        return torch.softmax(x @ y + 1.0, dim=-1).sum(0)

    y = torch.randn(16, 4)
    for batch in (8, 3, 64):
        x = torch.randn(batch, 16)
        t0 = time.perf_counter()
        out = f(x, y)
        first = (time.perf_counter() - t0) * 1e3
        torch.testing.assert_close(out, torch.softmax(x @ y + 1.0, dim=-1).sum(0))
        print(f"  batch {batch:>3}: matches eager; this call took {first:7.2f} ms")
    print(f"  stats: {f.stats}; target {f.artifacts[0].target}")
    print("  captured Graph IR (one graph serves every batch size):")
    print("    " + str(f.graphs[0].text).replace("\n", "\n    ").rstrip())
    print(f"  graph hash: {f.graphs[0].hash}")

    section("an nn.Module (parameters are graph inputs)")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    compiled = cu.compile(model, target=target)
    x = torch.randn(5, 16)
    torch.testing.assert_close(compiled(x), model(x))
    print("  matches eager;", compiled.stats)
    print("  inputs:", ", ".join(f"%{v.name}: {v.type}" for v in compiled.graphs[0].inputs))
    eager_ms, cuvil_ms = median_ms(model, x), median_ms(compiled, x)
    print(
        f"  median latency: eager {eager_ms:.3f} ms, cuvil {cuvil_ms:.3f} ms "
        f"(target {compiled.artifacts[0].target})"
    )

    section("why did it recompile?")

    @cu.compile(target=target)
    def g(x, k: int):
        return x * k

    g(torch.randn(3), 2)
    g(torch.randn(7), 2)
    g(torch.randn(7), 3)
    print(f"  compiles={g.stats.compiles} cache_hits={g.stats.cache_hits}")
    for r in g.stats.recompile_reasons:
        print(f"  recompiled because {r}")

    section("control flow without graph breaks")
    w = torch.randn(3, 1000)

    @cu.compile(target=target)
    def head(x):
        if x.size(0) > 1:  # a size predicate: both branches stay in one graph
            x = torch.nn.functional.interpolate(x, scale_factor=0.5)
        return torch.softmax(x.mean((2, 3)) @ w, dim=-1)

    for b in range(1, 17):
        x = torch.randn(b, 3, 16, 16)
        torch.testing.assert_close(head(x), head.__wrapped__(x))
    print(f"  batch sizes 1..16 match eager with {head.stats.compiles} compile(s)")

    @cu.compile(target=target)
    def halve(x):
        while x.norm() > 1.0:  # a tensor condition: one `while` op, decided at run time
            x = x / 2
        return x

    for scale in (0.1, 10.0, 1000.0):
        x = torch.full((4,), scale)
        torch.testing.assert_close(halve(x), halve.__wrapped__(x))
    print(f"  data-dependent while: 3 trip counts, {halve.stats.compiles} compile(s)")

    section("eager vs cuvil: median latency, compiles over a batch sweep")

    def ln_gelu(x, weight, bias):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.size(-1),), weight, bias))

    ln_w, ln_b = torch.randn(1024), torch.randn(1024)
    cases = [
        # name, the eager function, its inputs at batch size b, the batch sizes swept (the last one timed)
        ("softmax(x @ y + 1.0).sum(0)", f.__wrapped__, lambda b: (torch.randn(b, 16), y), (1, 5, 100, 4096)),
        ("gelu(layer_norm(x))", ln_gelu, lambda b: (torch.randn(b, 1024), ln_w, ln_b), (1, 7, 512, 2048)),
        (
            "head (interpolate, mean, @ w)",
            head.__wrapped__,
            lambda b: (torch.randn(b, 3, 224, 224),),
            (1, 2, 9, 16),
        ),
    ]
    print(f"  {'function':<30} {'timed input':<16} {'eager':>9} {'cuvil':>9}  compiles for batch sizes")
    for name, eager, inputs, sweep in cases:
        compiled = cu.compile(eager, target=target)  # fresh: its stats count this sweep only
        for b in sweep:
            args = inputs(b)
            # sums over thousands of rows are added in another order (vector lanes): a few ulp
            torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-5)
        eager_ms, cuvil_ms = median_ms(eager, *args), median_ms(compiled, *args)
        shape = "x".join(map(str, args[0].shape))
        batches = ", ".join(map(str, sweep))
        print(
            f"  {name:<30} {shape:<16} {eager_ms:6.3f} ms {cuvil_ms:6.3f} ms  "
            f"{compiled.stats.compiles} for {batches}"
        )
        for reason in compiled.stats.fallback_reasons[:1]:
            print(f"    (ran eagerly, not compiled: {reason})")
    print(f"  (medians of 50 calls on the {compiled.artifacts[0].target} target; every result matches eager)")

    section("clear errors")

    @cu.compile(target=target, fallback="error")
    def h(x):
        if x.sum() > 0:
            x = x[:1]
        return x

    try:
        h(torch.randn(3))
    except cu.CompileError as e:
        print("  " + str(e).replace("\n", "\n  "))


if __name__ == "__main__":
    main()
