"""Rules of the neural-network ops with an index-map or pointwise form: train-mode
``dropout`` (a counter-based mask) and nearest ``interpolate``."""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import (
    call,
    cast,
    const,
    float_attr,
    opmath,
    out_type,
    tensor_operand,
)
from cuvil_ir.tensor_ir.rules.table import rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val, idx, linear_offset


@rule("dropout")
def _dropout(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    """Train-mode dropout with a counter-based RNG: element ``i`` is kept when
    ``rand(seed, i) >= p``. ``seed`` is drawn from torch's generator once per call,
    so ``torch.manual_seed`` makes runs reproducible, and the mask does not depend
    on the schedule: dropout fuses into whatever kernel consumes it."""
    x = tensor_operand(x)
    t = out_type(n)
    p = float(float_attr(n, "p"))
    if p >= 1.0:
        return Lazy(t.shape, t.dtype, const(0, t.dtype))
    seed = lw.seed()
    counter = E.Index(linear_offset(x.shape, idx(x.rank)), DType.i64)
    keep = call("ge", E.Call("rand", (seed, counter), DType.f32), const(p, DType.f32), dtype=DType.bool)
    c = opmath(t.dtype)
    scaled = call("mul", cast(x.body, c), const(1.0 / (1.0 - p), c))
    return Lazy(t.shape, t.dtype, cast(E.Call("where", (keep, scaled, const(0, c)), c), t.dtype))


@rule("interpolate")
def _interpolate(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    """Nearest-neighbour resizing by power-of-two factors, as an index map.

    torch picks source ``floor(i * (1 / scale))`` in float; for a power-of-two
    factor that product is exact, so the integer map ``i // f`` (upsampling by f)
    or ``i * f`` (downsampling) gives the same elements. Other modes and factors
    run through torch.
    """
    x = tensor_operand(x)
    t = out_type(n)
    scales: Any = n.attr("scale_factor")
    if (
        n.attr("mode") != "nearest"
        or n.attr("antialias")
        or n.attr("recompute_scale_factor")
        or scales is None
        or len(scales) != x.rank - 2
    ):
        raise NotLowered("interpolate: only nearest by power-of-two scale factors is lowered")
    i = idx(t.rank)
    src: list[Any] = list(i[:2])
    for d, s in enumerate(scales):
        f = float(s)
        up, down = f >= 1, f < 1
        factor = f if up else 1 / f
        if factor != int(factor) or int(factor) & (int(factor) - 1):
            raise NotLowered("interpolate: scale factor not a power of two")
        k = int(factor)
        src.append(sympy.floor(i[2 + d] / k) if up else i[2 + d] * k)
        if down and x.shape[2 + d] == 0:
            raise NotLowered("interpolate of an empty dimension")
    return Lazy(t.shape, t.dtype, x.at(src))
