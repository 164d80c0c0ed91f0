"""Launching a generated kernel under Ascend's rules.

Each launch picks its block sizes from the sizes (:func:`cuvil_backend_ascend.rules.choose`:
the largest tiles that fit the unified buffer), a grid of at most one program per
vector core (each program loops over its share of the blocks), checks the launch
(:func:`cuvil_backend_ascend.rules.check_launch`), then runs it: through triton-ascend
on an NPU, in Triton's interpreter in simulation. No ``num_warps`` or
``num_stages`` is ever passed.
"""

from __future__ import annotations

import types
from typing import Any

from cuvil_backend_ascend.policy import AscendPolicy
from cuvil_backend_ascend.rules import check_launch, choose, grid
from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import Launch
from cuvil_runtime.triton_kernels import load as loader


class AscendLauncher:
    """``launcher(*buffers, *sizes, *derived, *scalars)``: the :class:`Launch` ``fn`` of one kernel.

    ``d0`` (the first derived argument) is the number of elements or rows, ``d1`` a
    row's longest extent. Returns nonzero when an integer division met a zero
    divisor (kernels with ``may_fail``). ``launches`` records each launch's
    ``(grid, config)`` when it is a list (tests)."""

    def __init__(self, tk: TritonKernel, fn: Any, policy: AscendPolicy, cores: int) -> None:
        self.tk = tk
        self.fn = fn
        self.policy = policy
        self.cores = cores
        self.first_derived = len(tk.buffers) + len(tk.sizes)
        self.launches: list[tuple[tuple[int, ...], dict[str, Any]]] | None = None

    def __call__(self, *args: Any) -> int:
        d0 = int(args[self.first_derived])
        if d0 <= 0:
            return 0
        d1 = int(args[self.first_derived + 1]) if self.tk.rows else 1
        config = choose(self.tk, d0, d1, self.policy)
        g = grid(d0, config, self.cores, self.policy)
        check_launch(self.tk, config, g, self.policy)
        if self.launches is not None:
            self.launches.append((g, config))
        return loader.run(self.fn, self.tk, g, args, config)


def make_launch(
    tk: TritonKernel, cu: types.ModuleType, mode: str, policy: AscendPolicy, cores: int
) -> Launch:
    launcher = AscendLauncher(tk, loader.load(tk, cu, mode), policy, cores)
    return loader.launch_of(tk, launcher)


__all__ = ["AscendLauncher", "make_launch"]
