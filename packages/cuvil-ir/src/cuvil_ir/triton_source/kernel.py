"""What the Triton generator produces and the target policy it follows: the generated
kernel (:class:`TritonKernel`), a target's :class:`TritonRules`, and the error for Tensor IR
it cannot express (plain data, no ``triton``)."""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from cuvil_ir.graph_ir.types import DType


class TritonCodegenError(NotImplementedError):
    """Tensor IR the generator cannot express (a bug: lowering should have made it an extern)."""


@dataclass(frozen=True, slots=True)
class TritonRules:
    """What a target's Triton compiler accepts and how its programs map onto the
    hardware: the choices the generated text depends on (a target's policy, as data)."""

    #: each program loops over blocks ``tl.program_id(0), + tl.num_programs(0), ...``
    #: instead of owning one: a grid of a fixed number of programs (one per core)
    #: serves any size (Ascend's rule; on CUDA one program per block)
    persistent: bool = False
    #: long rows' mean and variance in one pass (Welford: a three-operand ``tl.reduce``
    #: and float64 accumulators); else two passes in the input's dtype
    welford: bool = True


#: the rules of the ``cuda`` target (one program per block, Welford)
CUDA_RULES = TritonRules()


@dataclass(frozen=True)
class TritonKernel:
    """One generated kernel: its module text and how to call it (plain data, cached)."""

    name: str
    #: the module text: imports and one ``@triton.jit`` function named ``name``
    source: str
    #: pointer parameters, in order: the written buffer first
    buffers: tuple[str, ...]
    sizes: tuple[sympy.Symbol, ...]
    #: (expression, "int" | "float"): ``d0`` elements or rows, ``d1`` (rows only) the
    #: longest extent a row is walked over, then the kernel's own
    derived: tuple[tuple[sympy.Expr, str], ...]
    args: tuple[tuple[str, DType], ...]
    #: rows (reductions) or pointwise
    rows: bool
    #: an integer division may meet a zero divisor: the last pointer parameter is an
    #: int32 flag the kernel sets (``p_err``)
    may_fail: bool
    #: parameter name -> Triton signature type (``*fp32``, ``i64``, ``constexpr`` ...)
    signature: tuple[tuple[str, str], ...]
    #: ahead-of-time compiled text per stage the target adds (``ptx``); empty if none
    compiled: tuple[tuple[str, str], ...] = ()
    #: most tiles (``[XBLOCK]`` or ``[XBLOCK, RBLOCK]`` values) live at once, per variant:
    #: ``(pointwise,)`` or ``(one tile, looped)`` (:mod:`cuvil_ir.triton_source.tiles`)
    tiles: tuple[int, ...] = ()
    #: the widest element of the kernel's values, in bytes (sizes a tile's memory: at least
    #: 4, a half value being a float32 in registers, [Note: half precision in Triton])
    element_bytes: int = 4
    #: the narrowest element of the kernel's buffers in memory, in bytes (a float16 or
    #: bfloat16 buffer's 2, a bool's 1): a tile row of it is that many bytes per element
    narrow_bytes: int = 4


__all__ = ["CUDA_RULES", "TritonCodegenError", "TritonKernel", "TritonRules"]
