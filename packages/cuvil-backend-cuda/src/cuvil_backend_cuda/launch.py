"""Launching a generated kernel: block sizes per launch, autotuned on a GPU.

The kernel is loaded by :func:`cuvil_runtime.triton_kernels.load.load` with ``cu`` the device
library for the mode: the interpreter's (``tl`` builtins only) or the compiled one
(libdevice).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from cuvil_backend_cuda.autotune import Autotuner
from cuvil_backend_cuda.devicelib import namespace
from cuvil_backend_cuda.policy import LaunchPolicy
from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import Launch
from cuvil_runtime.triton_kernels import load as loader
from cuvil_runtime.triton_kernels.load import pow2


def load(tk: TritonKernel, interpret: bool) -> Any:
    """The kernel's ``@triton.jit`` function, ``cu`` bound for ``interpret`` or compiled code."""
    return loader.load(tk, namespace(interpret), "interpreted" if interpret else "compiled")


class KernelLauncher:
    """``launcher(*buffers, *sizes, *derived, *scalars)``: the :class:`Launch` ``fn`` of one kernel.

    Block sizes come from the policy and the launch's sizes (``d0`` rows or
    elements, ``d1`` a row's longest extent); on a GPU the autotuner picks among a
    few neighbours of that once per size bucket. Returns nonzero when an integer
    division met a zero divisor (kernels with ``may_fail``)."""

    def __init__(
        self, tk: TritonKernel, fn: Any, policy: LaunchPolicy, tuner: Autotuner | None, gpu: bool
    ) -> None:
        self.tk = tk
        self.fn = fn
        self.policy = policy
        self.tuner = tuner
        self.gpu = gpu
        self.nbuf = len(tk.buffers)
        self.first_derived = self.nbuf + len(tk.sizes)
        self.key = hashlib.sha256(tk.source.encode()).hexdigest()

    def base_config(self, d0: int, d1: int) -> dict[str, Any]:
        p = self.policy
        if not self.tk.rows:
            return {"XBLOCK": min(p.block, pow2(d0))}
        one_tile = d1 <= p.one_tile_max
        rblock = pow2(d1) if one_tile else p.loop_block
        xblock = min(pow2(d0), max(1, p.tile_elements // rblock))
        return {"XBLOCK": xblock, "RBLOCK": rblock, "ONE_TILE": one_tile}

    def candidates(self, base: dict[str, Any], d0: int) -> list[dict[str, Any]]:
        out = []
        for scale in (1, 2, 0.5):
            x = int(base["XBLOCK"] * scale)
            if x < 1 or x > pow2(d0) * (2 if scale > 1 else 1):
                continue
            for warps in (4, 8, 2):
                out.append({**base, "XBLOCK": x, "num_warps": warps})
        return out

    def __call__(self, *args: Any) -> int:
        d0 = int(args[self.first_derived])
        if d0 <= 0:
            return 0
        d1 = int(args[self.first_derived + 1]) if self.tk.rows else 1
        config = self.base_config(d0, d1)
        if self.gpu:
            config["num_warps"] = self.policy.num_warps
        if self.tuner is not None:
            bucket = f"{pow2(d0)}x{pow2(d1)}"
            config = self.tuner.pick(
                self.key,
                bucket,
                self.candidates(config, d0),
                lambda c: self._run(args, d0, c),
                args[: self.nbuf],
            )
        return self._run(args, d0, config)

    def _run(self, args: tuple[Any, ...], d0: int, config: dict[str, Any]) -> int:
        grid = ((d0 + config["XBLOCK"] - 1) // config["XBLOCK"],)
        return loader.run(self.fn, self.tk, grid, args, config)


def make_launch(
    tk: TritonKernel, interpret: bool, policy: LaunchPolicy, tuner: Autotuner | None
) -> tuple[Launch, Callable[..., int]]:
    launcher = KernelLauncher(tk, load(tk, interpret), policy, tuner, gpu=not interpret)
    launch = loader.launch_of(tk, launcher)
    return launch, launcher


__all__ = ["KernelLauncher", "load", "make_launch", "pow2"]
