"""The table of Tensor IR lowering rules, its registrar, and composite ops' lowering.

:data:`RULES` maps an op name to its rule (filled by the op-family modules of this
package through :func:`rule`); its ``get`` answers for a composite op without a rule
of its own with :func:`lower_decomposed`, which composes the rules of the op's
decomposition into one expression. An op that declares its scalar function
(``Op.scalar``) has the rule :func:`~cuvil_ir.tensor_ir.rules.scalar.scalar_rule`
makes of it, unless a family module writes one out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from cuvil_ir.graph_ir.decompose import NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.registry import REGISTRY, registrar
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.rules.helpers import (
    const,
    opmath,
    out_type,
    pointwise,
)
from cuvil_ir.tensor_ir.rules.scalar import scalar_rule
from cuvil_ir.tensor_ir.values import Lazy, NotLowered, Val

Rule = Callable[..., Any]


class _Rules(dict[str, Rule]):
    """Op name -> rule; ``get`` answers for a composite op without a rule of its own
    with :func:`lower_decomposed`, so lowering needs no table of composite ops."""

    def get(self, name: str, default: Any = None) -> Any:
        found = super().get(name)
        if found is None and name in REGISTRY and REGISTRY.get(name).scalar is not None:
            return _scalar_rule(name)  # an op declared after this table was filled (a plugin's)
        if found is None and uses_decomposition(name, "tensor_ir", native=False):
            return lower_decomposed
        return found if found is not None else default

    @staticmethod
    def native(lw: LoweringContext, n: Node, *operands: Val) -> Lazy:
        """A composite op's native lowering for the target (its ``lower_<policy.native>``
        attribute): one call of the expression over the broadcast operands and the
        attributes, in the result's dtype (see [Note: native calls] in
        :mod:`cuvil_ir.tensor_ir.expr`)."""
        t = out_type(n)
        name = n.op.replace("::", "__") + "__" + t.dtype.value
        body = str(n.attr(f"lower_{lw.policy.native}"))
        decl = REGISTRY.get(n.op)
        operand_names = tuple(getattr(decl, "operands", ()))
        attrs = [a for a in decl.attr_names if not a.startswith("lower_")]
        if len(n.outputs) != 1 or len(operand_names) != len(operands):
            raise NotLowered(f"{n.op}: a native lowering takes its operands and makes one result")
        for v in operands:
            if isinstance(v, Lazy) and (
                v.rank > len(t.shape)
                or any(
                    d != 1 and sympy.expand(sympy.sympify(d) - sympy.sympify(o)) != 0
                    for d, o in zip(v.shape, t.shape[len(t.shape) - v.rank :])
                )
            ):
                raise NotLowered(
                    f"{n.op}: a native lowering is elementwise, its operands broadcast to its result"
                )
        c = opmath(t.dtype)  # a half op's native form computes in float32 too ([Note: opmath])
        consts = [const(n.attr(a), c) for a in attrs]
        params = (*operand_names, *attrs)
        return pointwise(
            n,
            lambda *xs: E.native_call(name, params, body, (*xs, *consts), c),
            *operands,
            compute=t.dtype,
        )


RULES: dict[str, Rule] = _Rules()

rule = registrar(RULES)


def _scalar_rule(name: str) -> Rule:
    fn = REGISTRY.get(name).scalar
    assert fn is not None
    return scalar_rule(fn)


# Every op declared so far that names its scalar function has the rule of that function;
# a family module writing out a rule of its own for the op replaces it (pow, round).
for _name in REGISTRY.names():
    if REGISTRY.get(_name).scalar is not None:
        RULES[_name] = _scalar_rule(_name)


def lower_decomposed(lw: LoweringContext, n: Node, *operands: Val) -> list[Val]:
    """A composite op lowered from its decomposition: each primitive's rule composes
    onto its operands' expressions, and nothing in between is realized, so the result
    is one expression -- fused as if one rule had written it (softmax and layer norm
    stay one kernel per row). Any primitive that cannot be lowered here (a dtype or op
    the policy keeps out of kernels, no rule) makes the whole node one extern call."""
    try:
        ex = expand(n, lw.assumptions)
    except NotDecomposed as e:
        raise NotLowered(str(e)) from None
    env: dict[str, Val] = {v.name: x for v, x in zip(n.inputs, operands)}
    policy = lw.policy
    steps, buffers = len(lw.steps), dict(lw.buffers)  # a primitive's rule may realize
    try:
        for m in ex.nodes:
            kinds = [v.type.dtype for v in (*m.inputs, *m.outputs) if isinstance(v.type, TensorType)]
            r = RULES.get(m.op)
            if r is None or m.op in policy.extern_ops or any(d not in policy.dtypes for d in kinds):
                raise NotLowered(f"{n.op}: its primitive {m.op} is not lowered")
            res = r(lw, m, *(env[v.name] for v in m.inputs))
            for v, val in zip(m.outputs, res if isinstance(res, (list, tuple)) else [res]):
                env[v.name] = val
    except NotLowered:
        del lw.steps[steps:]  # the node becomes one extern: no kernel of a partial attempt stays
        lw.buffers = buffers
        raise
    return [env[v.name] for v in ex.outputs]
