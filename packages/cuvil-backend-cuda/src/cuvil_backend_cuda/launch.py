"""Loading a generated kernel and launching it: block sizes per launch, autotuned on a GPU.

A :class:`~cuvil_ir.triton_source.emit.TritonKernel`'s text comes from the program
cache (signed, never from a file another user could write) and is executed in a
fresh namespace whose ``cu`` is the device library for the mode: the interpreter's
(``tl`` builtins only) or the compiled one (libdevice). Its lines are registered
with :mod:`linecache` because ``triton.jit`` reads a kernel's source.
"""

from __future__ import annotations

import hashlib
import linecache
from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_cuda.autotune import Autotuner
from cuvil_backend_cuda.devicelib import namespace
from cuvil_backend_cuda.policy import LaunchPolicy
from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import Launch


def load(tk: TritonKernel, interpret: bool) -> Any:
    """The kernel's ``@triton.jit`` function, ``cu`` bound for ``interpret`` or compiled code."""
    digest = hashlib.sha256(tk.source.encode()).hexdigest()[:16]
    filename = f"<cuvil triton {tk.name} {digest} {'interpreted' if interpret else 'compiled'}>"
    linecache.cache[filename] = (len(tk.source), None, tk.source.splitlines(True), filename)
    ns: dict[str, Any] = {"__name__": f"cuvil_triton_{tk.name}", "cu": namespace(interpret)}
    exec(compile(tk.source, filename, "exec"), ns)
    return ns[tk.name]


def pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


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
        if not self.tk.may_fail:
            self.fn[grid](*args, **config)
            return 0
        first = args[0]
        err = torch.zeros(1, dtype=torch.int32, device=first.device)
        self.fn[grid](*args[: self.nbuf], err, *args[self.nbuf :], **config)
        return int(err.item())


def make_launch(
    tk: TritonKernel, interpret: bool, policy: LaunchPolicy, tuner: Autotuner | None
) -> tuple[Launch, Callable[..., int]]:
    launcher = KernelLauncher(tk, load(tk, interpret), policy, tuner, gpu=not interpret)
    launch = Launch(
        fn=launcher,
        buffers=tk.buffers,
        sizes=tk.sizes,
        derived=tk.derived,
        scalars=tk.args,
        may_fail=tk.may_fail,
        tensors=True,
    )
    return launch, launcher


__all__ = ["KernelLauncher", "load", "make_launch", "pow2"]
