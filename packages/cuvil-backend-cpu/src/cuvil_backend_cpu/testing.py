"""Helpers for tests of code compiled for the ``cpu`` target."""

from __future__ import annotations

from typing import Any

import torch

from cuvil_ir.graph_ir.ops.quant import pack_int4, round_activations
from cuvil_runtime.pipeline import ProgramExecutable


def executable_of(compiled: Any) -> ProgramExecutable:
    """The :class:`ProgramExecutable` behind the latest artifact of a ``cu.compile``
    result compiled for ``cpu`` (its ``stages``, ``report`` and ``program``)."""
    art = compiled.artifacts[-1]
    ex = art.executable
    if art.target != "cpu" or not isinstance(ex, ProgramExecutable):
        raise TypeError(f"the latest artifact did not compile for cpu: {art.target}, {type(ex).__name__}")
    return ex


def native_runs_here() -> bool:
    """Whether programs compiled here get native runs: this host's kernels are not emulated
    (``$CUVIL_CPU_EMULATE``: another ISA's kernels take tensors, run from Python)."""
    from cuvil_backend_cpu.kernel_cache import KernelCache

    return not KernelCache().toolchain.emulator


def native_runs_used(compiled: Any) -> dict[tuple[int, ...], list[bool]]:
    """Per size binding that ran on this thread: for each native run of the wrapper, whether
    the binding ran it natively (tables made) or from Python (refused) ([Note: native runs] in
    cuvil_runtime.native_runs). ``compiled``: a ``cu.compile`` result (its latest artifact),
    a ``cu.load`` result or a :class:`ProgramExecutable`."""
    exe = compiled if isinstance(compiled, ProgramExecutable) else getattr(compiled, "executable", None)
    runner = (exe if isinstance(exe, ProgramExecutable) else executable_of(compiled))._runner
    plans = getattr(runner._local, "plans", {})
    return {key: [t is not None for t in p.native] for key, p in plans.items() if p.native is not None}


class Weight:
    """A random weight of ``fmt``: the stored tensors and the float64 matrix they stand for,
    computed here from the codes (not by the library's dequantize). ``"int4-a8"`` stores
    ``"int4"``'s; :meth:`check` multiplies it by the activations rounded as that format rounds
    them (torch's :func:`round_activations`, not the kernel's)."""

    def __init__(self, fmt: str, n: int, k: int, group: int = 0, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.fmt, self.group = fmt, group
        self.scales = self.zeros = None
        if fmt == "bf16":
            self.weight = torch.randn(n, k, generator=g).bfloat16()
            self.w64 = self.weight.double()
        elif fmt == "int8":
            self.weight = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
            self.scales = torch.rand(n, generator=g) * 0.02 + 1e-3
            self.w64 = self.weight.double() * self.scales.double()[:, None]
        else:
            q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            self.weight = pack_int4(q)
            self.scales = torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
            self.zeros = torch.randn(n, k // group, generator=g) * 0.01
            per = (q.double().reshape(n, k // group, group) - 8) * self.scales.double()[..., None]
            self.w64 = (per + self.zeros.double()[..., None]).reshape(n, k)

    def params(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.scales, self.zeros) if t is not None)

    def check(self, got: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> None:
        if self.fmt == "int4-a8":
            x = round_activations(x)
        want = x.double() @ self.w64.t() + (0 if bias is None else bias.double())
        # float32 accumulation over K terms: bounded by K eps times the sum of |x| |w|
        tol = 4e-6 * (x.double().abs() @ self.w64.abs().t()).max().item() + 1e-6
        assert got.dtype == torch.float32 and got.shape == want.shape
        err = (got.double() - want).abs().max().item()
        assert err <= tol, f"{self.fmt}: error {err:.3g} > {tol:.3g}"
