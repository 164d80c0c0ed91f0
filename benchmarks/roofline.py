"""The roofline of each workload, measured on the host in the same run as the workloads.

Two machine rates, measured once per run (:func:`measure_machine`):

* **copy bandwidth**: the median time of ``dst.copy_(src)`` for fp32 tensors of
  16 MiB and 256 MiB, as bytes moved (read + written, so twice the tensor's size) per
  second. 16 MiB of each side fits in a large L3 on some hosts; 256 MiB does not.
* **SGEMM rate**: the median time of ``torch.mm`` of two 1024 x 1024 fp32 matrices,
  as ``2 * 1024**3`` FLOPs per second, with the run's torch threads.

Per workload (:func:`workload_cost`): the **bytes moved** -- every tensor the call
reads (its arguments and, for a module, its parameters and buffers) plus every tensor
it returns, each counted once: what the call must at least move between memory and
the cores -- and the **FLOPs** of its matrix products, convolutions and attention
(``torch.utils.flop_counter.FlopCounterMode``, plus the two products of torch's CPU
attention kernel, which torch 2.13's counter misses: :func:`_cpu_sdpa_flops`;
pointwise and reduction work counts 0).
From these, two lower bounds on the time of one call:

* copy-bound time = bytes moved / copy bandwidth (the rate of the fixed size nearest
  to the workload's bytes, in log scale);
* GEMM-bound time = FLOPs / SGEMM rate.

The larger of the two is the workload's bound and names its kind (``copy`` or
``gemm``). For a copy-bound workload, ``benchmarks.run`` also times a same-size copy
(``dst.copy_(src)`` with ``src`` and ``dst`` each half the bytes moved) in the same
round-robin as the implementations, and that median replaces the estimate: the same
threads, the same noise, the same cache state. Likewise a GEMM-bound workload gets the
1024^3 ``torch.mm`` in its round-robin, and its GEMM-bound time uses that rate. ``x bound`` is an implementation's
median / bound time (1.00x: at the bound; the issue's target for softmax is 1.5x).

Only ``torch`` is needed; the host's ISA comes from ``/proc/cpuinfo`` and Cuvil's
from ``cuvil_backend_cpu.toolchain`` (which honours ``CUVIL_CPU_ISA``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

MiB = 1 << 20
#: tensor sizes (bytes of each of src and dst) of the machine's copy bandwidth
COPY_SIZES = (16 * MiB, 256 * MiB)
GEMM_N = 1024


def _median_time(fn: Any, budget_s: float, min_reps: int) -> float:
    """Median seconds per call of ``fn`` after two warm-up calls."""
    fn()
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 2000:
            break
    times.sort()
    return times[len(times) // 2]


def measure_copy(nbytes: int, budget_s: float = 0.5, min_reps: int = 5) -> dict[str, float]:
    """Copy bandwidth for fp32 tensors of ``nbytes`` each: bytes moved = 2 * nbytes."""
    n = max(1, nbytes // 4)
    src = torch.randn(n)
    dst = torch.empty(n)
    t = _median_time(lambda: dst.copy_(src), budget_s, min_reps)
    return {"bytes": nbytes, "median_ms": t * 1e3, "gbps": 2 * n * 4 / t / 1e9}


def measure_sgemm(n: int = GEMM_N, budget_s: float = 0.5, min_reps: int = 5) -> dict[str, float]:
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)
    t = _median_time(lambda: torch.mm(a, b, out=out), budget_s, min_reps)
    return {"n": n, "median_ms": t * 1e3, "gflops": 2 * n**3 / t / 1e9}


def measure_machine(quick: bool) -> dict[str, Any]:
    """The copy bandwidths and the SGEMM rate, with the current torch threads."""
    budget, reps = (0.2, 3) if quick else (0.6, 5)
    copies = [measure_copy(size, budget, reps) for size in COPY_SIZES]
    return {
        "copy": copies,
        "sgemm": measure_sgemm(GEMM_N, budget, reps),
        "threads": torch.get_num_threads(),
    }


def copy_gbps(machine: dict[str, Any], nbytes: float) -> float:
    """The measured copy bandwidth of the fixed size nearest to ``nbytes`` (log scale)."""
    copies = machine["copy"]
    best = min(copies, key=lambda c: abs(math.log(max(nbytes, 1) / 2) - math.log(c["bytes"])))
    return float(best["gbps"])


def _tensors(tree: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _nbytes(tensors: list[torch.Tensor]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()))
        if key in seen:  # the same tensor twice (tied weights) is read once
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _cpu_sdpa_flops(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``aten._scaled_dot_product_flash_attention_for_cpu``'s FLOPs (shapes in): q kᵀ
    and p v, as torch counts its other attention kernels (a causal mask not discounted)."""
    batch = math.prod(q[:-2])
    (lq, e), (s, ev) = q[-2:], v[-2:]
    return 2 * batch * lq * s * (e + ev)


def workload_cost(fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """Bytes moved (inputs read + outputs written) and matmul/conv/attention FLOPs of
    one call."""
    from torch.utils.flop_counter import FlopCounterMode

    inputs = _tensors(args)
    if isinstance(fn, torch.nn.Module):
        inputs += list(fn.parameters()) + list(fn.buffers())
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    counter = FlopCounterMode(display=False, custom_mapping={cpu_sdpa: _cpu_sdpa_flops} if cpu_sdpa else None)
    with torch.no_grad(), counter:
        out = fn(*args)
    in_bytes, out_bytes = _nbytes(inputs), _nbytes(_tensors(out))
    return {
        "bytes_in": in_bytes,
        "bytes_out": out_bytes,
        "bytes": in_bytes + out_bytes,
        "flops": int(counter.get_total_flops()),
    }


def bound(cost: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """The copy-bound and GEMM-bound times (ms) of a workload, and which one is larger."""
    copy_ms = cost["bytes"] / (copy_gbps(machine, cost["bytes"]) * 1e9) * 1e3
    gemm_ms = cost["flops"] / (machine["sgemm"]["gflops"] * 1e9) * 1e3
    kind = "copy" if copy_ms >= gemm_ms else "gemm"
    return {
        "copy_est_ms": copy_ms,
        "gemm_ms": gemm_ms,
        "kind": kind,
        "bound_ms": max(copy_ms, gemm_ms),
    }


def same_size_copy(cost: dict[str, Any]) -> Any:
    """A callable copying fp32 tensors of half the workload's bytes moved each
    (so it moves as many bytes as the workload must)."""
    n = max(1, cost["bytes"] // 8)
    src = torch.randn(n)
    dst = torch.empty(n)

    def copy(*_args: Any) -> torch.Tensor:
        return dst.copy_(src)

    return copy


def sgemm_call(n: int = GEMM_N) -> Any:
    """A callable running ``torch.mm`` of two ``n`` x ``n`` fp32 matrices (``2 * n**3`` FLOPs)."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    out = torch.empty(n, n)

    def mm(*_args: Any) -> torch.Tensor:
        return torch.mm(a, b, out=out)

    return mm


def host_info() -> dict[str, Any]:
    """The host a benchmark ran on: CPU model, cores, torch's version, vector ISA."""
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "isa": host_isa()}


def host_isa() -> dict[str, Any]:
    """The host's vector ISA features from /proc/cpuinfo (x86: avx2, avx512f, bf16)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
        "bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
        "amx": "amx_tile" in flags,
    }


def cuvil_isa() -> dict[str, Any]:
    """What Cuvil's cpu kernels are built for in this process (``CUVIL_CPU_ISA`` applied)."""
    import os

    requested = os.environ.get("CUVIL_CPU_ISA", "") or "native"
    try:
        from cuvil_backend_cpu.toolchain import find_toolchain

        tc = find_toolchain()
    except Exception as exc:  # no compiler, or an ISA this CPU cannot run
        return {"requested": requested, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    march = [f for f in tc.flags if f.startswith("-march")]
    return {
        "requested": requested,
        "isa": tc.isa,
        "march": " ".join(march),
        "vector_bytes": tc.vector_bytes,
        "simd_math": tc.simd_math,
    }
