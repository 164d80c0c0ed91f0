"""Rules of the reductions over dims (``sum``, ``prod``, ``amax``, ``amin``, ``any``,
``all``, ``mean``): one ``Reduce`` expression per result element."""

from __future__ import annotations

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import (
    call,
    cast,
    count,
    norm_dims,
    opmath,
    out_type,
    reduce,
    tensor_operand,
)
from cuvil_ir.tensor_ir.rules.table import rule
from cuvil_ir.tensor_ir.values import Lazy, Val

# -- reductions -----------------------------------------------------------------------
_REDUCE = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "any": "any", "all": "all"}


@rule(*_REDUCE)
def _reduction(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    if x.rank == 0:
        return Lazy(t.shape, t.dtype, cast(x.body, t.dtype))
    keep = bool(n.attr("keepdim"))
    kind = _REDUCE[n.op]
    # half sums accumulate in float32 and round once ([Note: opmath])
    dt = DType.bool if kind in ("any", "all") else opmath(t.dtype)
    body = reduce(lw, kind, x, dims, keep=keep, dtype=dt)
    return Lazy(t.shape, t.dtype, cast(body, t.dtype))


@rule("mean")
def _mean(lw: LoweringContext, n: Node, x: Val) -> Lazy:
    x = tensor_operand(x)
    t = out_type(n)
    dims = norm_dims(n.attr("dims"), x.rank)
    if x.rank == 0:
        return Lazy(t.shape, t.dtype, cast(x.body, t.dtype))
    c = opmath(t.dtype)  # a half mean divides the float32 sum and rounds once, as eager does
    s = reduce(lw, "sum", x, dims, keep=bool(n.attr("keepdim")), dtype=c)
    return Lazy(t.shape, t.dtype, cast(call("div", s, count(x, dims, c)), t.dtype))
