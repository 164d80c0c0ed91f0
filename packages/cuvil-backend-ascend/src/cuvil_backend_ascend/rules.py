"""Ascend's launch rules: choosing each launch's block sizes and grid, and checking them.

Every launch goes through :func:`check_launch`, on an NPU and in simulation alike,
and a kernel whose smallest legal tile cannot fit the policy's share of the
unified buffer is refused when it is compiled (:func:`validate`): a violation is
a :class:`LaunchRuleError` (a compile error naming the kernel and the rule), never
a warning and never a launch the hardware would fault on.

The memory a launch needs is ``XBLOCK * RBLOCK * (tiles * element_bytes +
address_bytes + staging)``: the most tiles the kernel holds at once (the generator's
count, :mod:`cuvil_ir.triton_source.tiles`), each element as wide as the kernel's widest
value (at least 4 bytes: a float16 or bfloat16 value is computed in float32, [Note: half
precision in Triton]), plus one int64 address per element for the load or store being
made, plus, where a buffer is narrower than the values (a half buffer's 2 bytes, a bool's
1), the narrow tile a load lands in before it is widened (or a store's before it is
written). Alignment is in bytes too: a tile row of every buffer is a multiple of 32
bytes, so the narrowest buffer decides the least block (16 elements of a half buffer,
8 of a float32 one).
"""

from __future__ import annotations

from typing import Any

from cuvil_backend_ascend.policy import AscendPolicy
from cuvil_ir.triton_source.emit import TritonKernel
from cuvil_runtime.target import TargetError
from cuvil_runtime.triton_kernels.load import pow2

#: the only launch options Ascend kernels take (no num_warps, num_stages: SIMD cores)
OPTIONS = frozenset({"XBLOCK", "RBLOCK", "ONE_TILE"})


class LaunchRuleError(TargetError):
    """A kernel or launch that breaks one of Ascend's rules (grid, buffer, alignment, options)."""


def _floor_pow2(n: int) -> int:
    """The largest power of two <= ``n`` (0 for ``n < 1``)."""
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 0


def align_elements(tk: TritonKernel, policy: AscendPolicy) -> int:
    """Elements of a tile row that is a multiple of 32 bytes in every buffer of the kernel
    (the least ``RBLOCK``, or pointwise ``XBLOCK``): the narrowest buffer's count."""
    return max(1, policy.align_bytes // min(tk.narrow_bytes, tk.element_bytes))


def element_cost(tk: TritonKernel, variant: int, policy: AscendPolicy) -> int:
    """Bytes of unified buffer one tile element costs in ``variant`` (0: pointwise or one
    tile): its live value tiles, its address, and a narrow buffer's landing tile."""
    live = tk.tiles[variant] if variant < len(tk.tiles) else max(tk.tiles, default=1)
    staging = tk.narrow_bytes if tk.narrow_bytes < tk.element_bytes else 0
    return max(1, live) * tk.element_bytes + policy.address_bytes + staging


def needed_bytes(tk: TritonKernel, config: dict[str, Any], policy: AscendPolicy) -> int:
    variant = 0 if not tk.rows or config.get("ONE_TILE") else 1
    return int(config["XBLOCK"]) * int(config.get("RBLOCK", 1)) * element_cost(tk, variant, policy)


def choose(tk: TritonKernel, d0: int, d1: int, policy: AscendPolicy) -> dict[str, Any]:
    """Block sizes for ``d0`` elements (pointwise) or rows of ``d1`` elements: the
    largest power-of-two tiles that fit the budget, a row in one tile when it fits."""
    budget = policy.budget
    align = align_elements(tk, policy)
    if not tk.rows:
        fit = _floor_pow2(budget // element_cost(tk, 0, policy))
        return {"XBLOCK": max(align, min(policy.max_block, pow2(d0), fit))}
    one = max(pow2(d1), align)
    cost = element_cost(tk, 0, policy)
    if one * cost <= budget:
        return {
            "XBLOCK": max(1, min(pow2(d0), _floor_pow2(budget // (one * cost)))),
            "RBLOCK": one,
            "ONE_TILE": True,
        }
    cost = element_cost(tk, 1, policy)
    rblock = max(align, min(policy.loop_block, _floor_pow2(budget // cost)))
    xblock = max(1, min(pow2(d0), _floor_pow2(budget // (rblock * cost))))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "ONE_TILE": False}


def grid(d0: int, config: dict[str, Any], cores: int, policy: AscendPolicy) -> tuple[int]:
    """One program per core at most, each looping over its share of the blocks."""
    blocks = -(-int(d0) // int(config["XBLOCK"]))
    return (max(1, min(blocks, cores, policy.max_programs)),)


def check_launch(
    tk: TritonKernel, config: dict[str, Any], grid: tuple[int, ...], policy: AscendPolicy
) -> None:
    """Raise :class:`LaunchRuleError` unless this launch keeps every rule."""
    where = f"kernel {tk.name}"
    extra = sorted(set(config) - OPTIONS)
    if extra:
        raise LaunchRuleError(
            f"{where}: launch options {extra} are not Ascend's (its vector cores are SIMD: no warps, "
            f"no pipeline stages); only {sorted(OPTIONS)}"
        )
    if len(grid) != 1:
        raise LaunchRuleError(f"{where}: a {len(grid)}-D grid {grid}; Ascend launches 1-D grids")
    if not 1 <= grid[0] <= policy.max_programs:
        raise LaunchRuleError(
            f"{where}: a grid of {grid[0]} programs; Ascend launches 1 to {policy.max_programs}"
        )
    for key in ("XBLOCK", "RBLOCK"):
        if key in config and pow2(config[key]) != config[key]:
            raise LaunchRuleError(f"{where}: {key}={config[key]} is not a power of two")
    block = int(config["RBLOCK"] if tk.rows else config["XBLOCK"])
    for size in sorted({tk.narrow_bytes, tk.element_bytes}):
        row = block * size
        if row % policy.align_bytes:
            raise LaunchRuleError(
                f"{where}: a tile row of {row} bytes ({block} elements of {size} bytes); rows must be "
                f"multiples of {policy.align_bytes} bytes (the unified buffer is read in 32-byte blocks)"
            )
    need = needed_bytes(tk, config, policy)
    if need > policy.budget:
        raise LaunchRuleError(
            f"{where}: {config} needs {need} bytes of unified buffer "
            f"({tk.tiles} live tiles of {tk.element_bytes}-byte elements); the policy allows {policy.budget} "
            f"({policy.ub_share:g} of {policy.ub_bytes})"
        )


def smallest(tk: TritonKernel, policy: AscendPolicy) -> dict[str, Any]:
    """The smallest legal launch of ``tk``: one aligned row (the looped variant for rows)."""
    align = align_elements(tk, policy)
    if not tk.rows:
        return {"XBLOCK": align}
    return {"XBLOCK": 1, "RBLOCK": align, "ONE_TILE": False}


def validate(tk: TritonKernel, policy: AscendPolicy, cores: int) -> None:
    """Refuse, at compile time, a kernel no launch of which keeps the rules."""
    if not 1 <= cores <= policy.max_programs:
        raise LaunchRuleError(
            f"a grid of {cores} programs (one per core) breaks Ascend's limit of 1 to {policy.max_programs}"
        )
    check_launch(tk, smallest(tk, policy), (1,), policy)


def aot_configs(tk: TritonKernel, policy: AscendPolicy) -> list[dict[str, Any]]:
    """The launches the compile check builds: pointwise at a large size; rows in one
    tile (a short row) and looped (a long one), so both variants reach the compiler."""
    big = 1 << 20
    if not tk.rows:
        return [choose(tk, big, 1, policy)]
    configs = [choose(tk, big, 256, policy), choose(tk, big, big, policy)]
    return [c for k, c in enumerate(configs) if c not in configs[:k]]


__all__ = [
    "OPTIONS",
    "LaunchRuleError",
    "aot_configs",
    "align_elements",
    "check_launch",
    "choose",
    "element_cost",
    "grid",
    "needed_bytes",
    "smallest",
    "validate",
]
