"""``paged_attention`` on the ``ascend`` target: the Triton kernel the ``cuda`` target runs
(:mod:`cuvil_runtime.triton_kernels.paged_attention`), launched under Ascend's rules
(docs/ascend-backend.md, :mod:`cuvil_backend_ascend.rules`):

* a 1-D grid of at most one program per vector core (each program loops over its share of the
  (token, kv head) items), never more than the runtime's 65535;
* no ``num_warps`` or ``num_stages`` (SIMD vector cores): the only launch options are the tile
  sizes ``GP``, ``DP`` and ``BLOCK_N``;
* the live tiles fit the policy's share of the unified buffer: :func:`needed_bytes` counts them
  (the ``[GP, BLOCK_N, DP]`` product, one at a time, the K and V tiles with one int64 address per element
  and, for a half cache, the narrow tile a load lands in, the query and the accumulator), and
  :func:`choose` takes the largest ``BLOCK_N`` that fits;
* tile rows are multiples of 32 bytes (``DP`` at least 16: 32 bytes of a half cache);
* a decode step split along the sequence (fewer items than cores) merges its chunks in a
  second kernel under the same grid, whose ``[splits, DP]`` tile must fit too
  (:func:`merge_bytes`).

Every launch is checked (:func:`check_launch`), in simulation and on an NPU alike; a head size
no legal tile can hold is a :class:`~cuvil_backend_ascend.rules.LaunchRuleError` naming the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cuvil_backend_ascend.declared import SIM
from cuvil_backend_ascend.policy import AscendPolicy
from cuvil_backend_ascend.rules import LaunchRuleError
from cuvil_ir.graph_ir.ops import paged

#: the Graph IR op this module runs
OP = paged.PagedAttention.name

#: the constexprs of the kernel (the only launch options it takes here)
OPTIONS = frozenset({"GP", "DP", "BLOCK_N"})

#: positions per step: the largest that fits is taken, up to this
MAX_BLOCK_N = 64
#: and at least this (8 float32 positions: a 32-byte row of scores)
MIN_BLOCK_N = 8

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def needed_bytes(config: dict[str, int], cache_bytes: int, policy: AscendPolicy) -> int:
    """Bytes of unified buffer the kernel's live tiles take with these tile sizes."""
    gp, dp, bn = config["GP"], config["DP"], config["BLOCK_N"]
    products = gp * bn * dp * 4  # q * k, then p * v: one [GP, BLOCK_N, DP] float32 tile at a time
    kv = 2 * bn * dp * (4 + policy.address_bytes + (cache_bytes if cache_bytes < 4 else 0))
    rows = 3 * gp * dp * 4 + 3 * gp * bn * 4  # q, acc, out; scores, probabilities, a mask
    return products + kv + rows


def merge_bytes(splits: int, head_dim: int, policy: AscendPolicy) -> int:
    """Bytes of unified buffer the split's merge takes: one ``[SP, DP]`` float32 tile of
    partial accumulators with its addresses, and the maxima and sums."""
    sp, dp = _pow2(splits), max(16, _pow2(head_dim))
    return sp * dp * (4 + policy.address_bytes) + 4 * sp * (4 + policy.address_bytes) + dp * 4


def choose(group: int, head_dim: int, cache_bytes: int, policy: AscendPolicy) -> dict[str, int]:
    """The tile sizes of one launch: the largest ``BLOCK_N`` whose tiles fit the budget (the
    least when none does: :func:`check_launch` then says why)."""
    config = {"GP": _pow2(group), "DP": max(16, _pow2(head_dim)), "BLOCK_N": MIN_BLOCK_N}
    bn = MAX_BLOCK_N
    while bn > MIN_BLOCK_N and needed_bytes({**config, "BLOCK_N": bn}, cache_bytes, policy) > policy.budget:
        bn //= 2
    return {**config, "BLOCK_N": bn}


def check_launch(
    config: dict[str, Any], grid: tuple[int, ...], cache_bytes: int, policy: AscendPolicy
) -> None:
    """Raise :class:`LaunchRuleError` unless this launch keeps every rule (see the module doc)."""
    where = "kernel paged_attention_kernel"
    extra = sorted(set(config) - OPTIONS)
    if extra:
        raise LaunchRuleError(
            f"{where}: launch options {extra} are not Ascend's (its vector cores are SIMD: no warps, "
            f"no pipeline stages); only {sorted(OPTIONS)}"
        )
    if len(grid) != 1 or not 1 <= grid[0] <= policy.max_programs:
        raise LaunchRuleError(
            f"{where}: grid {grid}; Ascend launches 1-D grids of 1 to {policy.max_programs}"
        )
    for key in sorted(OPTIONS):
        if _pow2(config[key]) != config[key]:
            raise LaunchRuleError(f"{where}: {key}={config[key]} is not a power of two")
    for size in sorted({cache_bytes, 4}):
        if (config["DP"] * size) % policy.align_bytes:
            raise LaunchRuleError(
                f"{where}: a tile row of {config['DP']} elements of {size} bytes; rows must be multiples "
                f"of {policy.align_bytes} bytes (the unified buffer is read in 32-byte blocks)"
            )
    need = needed_bytes(config, cache_bytes, policy)
    if need > policy.budget:
        raise LaunchRuleError(
            f"{where}: {config} needs {need} bytes of unified buffer; the policy allows {policy.budget} "
            f"({policy.ub_share:g} of {policy.ub_bytes}): a head size of {config['DP']} with "
            f"{config['GP']} query heads per kv head does not fit"
        )


def takes(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the kernel runs these operands here (the rest runs the reference)."""
    device = "cpu" if SIM else "npu"
    return (
        query.device.type == key_cache.device.type == value_cache.device.type == device
        and query.dtype in DTYPES
        and key_cache.dtype == value_cache.dtype
        and key_cache.dtype in DTYPES
        and query.dim() == 3
        and key_cache.dim() == 4
    )


def extern(
    reference: Callable[..., Any], policy: AscendPolicy, cores: int, launches: list[Any] | None = None
) -> Callable[..., Any]:
    """What a ``paged_attention`` extern call runs: the kernel under the rules, or ``reference``
    for operands it does not take. ``launches`` (tests) records each launch's (grid, config)."""
    from cuvil_runtime.triton_kernels.paged_attention import launch, plan_splits

    def run(
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        *,
        scale: float,
    ) -> torch.Tensor:
        operands = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
        if not takes(query, key_cache, value_cache):
            return reference(*operands, scale=scale)  # type: ignore[no-any-return]
        paged.check_paged(*operands)
        group, head_dim = query.shape[1] // key_cache.shape[2], query.shape[2]
        cache_bytes = key_cache.element_size()
        config = choose(group, head_dim, cache_bytes, policy)
        items = query.shape[0] * key_cache.shape[2]
        grid = (max(1, min(items, cores, policy.max_programs)),)
        check_launch(config, grid, cache_bytes, policy)
        span = block_tables.shape[1] * key_cache.shape[1]
        splits, _ = plan_splits(items, span, config["BLOCK_N"], cores)
        if splits > 1 and merge_bytes(splits, head_dim, policy) > policy.budget:
            raise LaunchRuleError(
                f"kernel paged_attention_merge: {splits} splits of a head size of {head_dim} need "
                f"{merge_bytes(splits, head_dim, policy)} bytes of unified buffer; the policy allows {policy.budget}"
            )
        if launches is not None:
            launches.append((grid, config))
        return launch(*operands, scale=scale, block_n=config["BLOCK_N"], programs=grid[0], target=cores)

    return run


__all__ = [
    "DTYPES",
    "OP",
    "OPTIONS",
    "check_launch",
    "choose",
    "extern",
    "merge_bytes",
    "needed_bytes",
    "takes",
]
