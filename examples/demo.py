"""Cuvil demo: compile a function and a module on the default target, check them
against eager PyTorch, and show what was captured.

    nox -s demo          (or: python examples/demo.py)
"""

from __future__ import annotations

import time

import torch

import cuvil as cu


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 66 - len(title)))


def median_ms(fn, *args, repeat: int = 50) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    section("targets (cuvil backends)")
    for b in cu.backends():
        state = "available" if b.available else f"unavailable: {b.reason}"
        print(f"  {b.name:<12} {state}")

    section("a function")

    @cu.compile
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
    print(f"  stats: {f.stats}")
    print("  captured Graph IR (one graph serves every batch size):")
    print("    " + str(f.graphs[0].text).replace("\n", "\n    ").rstrip())
    print(f"  graph hash: {f.graphs[0].hash}")

    section("an nn.Module (parameters are graph inputs)")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    compiled = cu.compile(model)
    x = torch.randn(5, 16)
    torch.testing.assert_close(compiled(x), model(x))
    print("  matches eager;", compiled.stats)
    print("  inputs:", ", ".join(f"%{v.name}: {v.type}" for v in compiled.graphs[0].inputs))
    eager_ms, cuvil_ms = median_ms(model, x), median_ms(compiled, x)
    print(
        f"  median latency: eager {eager_ms:.3f} ms, cuvil {cuvil_ms:.3f} ms "
        f"(target {compiled.artifacts[0].target}; the optimizing CPU target is the next milestone)"
    )

    section("why did it recompile?")

    @cu.compile
    def g(x, k: int):
        return x * k

    g(torch.randn(3), 2)
    g(torch.randn(7), 2)
    g(torch.randn(7), 3)
    print(f"  compiles={g.stats.compiles} cache_hits={g.stats.cache_hits}")
    for r in g.stats.recompile_reasons:
        print(f"  recompiled because {r}")

    section("control flow without graph breaks")
    w = torch.randn(3, 10)

    @cu.compile
    def head(x):
        if x.size(0) > 1:  # a size predicate: both branches stay in one graph
            x = torch.nn.functional.interpolate(x, scale_factor=0.5)
        return torch.softmax(x.mean((2, 3)) @ w, dim=-1)

    for b in range(1, 17):
        x = torch.randn(b, 3, 16, 16)
        torch.testing.assert_close(head(x), head.__wrapped__(x))
    print(f"  batch sizes 1..16 match eager with {head.stats.compiles} compile(s)")

    @cu.compile
    def halve(x):
        while x.norm() > 1.0:  # a tensor condition: one `while` op, decided at run time
            x = x / 2
        return x

    for scale in (0.1, 10.0, 1000.0):
        x = torch.full((4,), scale)
        torch.testing.assert_close(halve(x), halve.__wrapped__(x))
    print(f"  data-dependent while: 3 trip counts, {halve.stats.compiles} compile(s)")

    section("clear errors")

    @cu.compile(fallback="error")
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
