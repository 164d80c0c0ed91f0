"""Graph IR verifier: SSA, dominance, op schema, and types.

Types are checked by replaying each op's shape rule under the graph's recorded
assumptions (no example values), and comparing symbolically with the recorded
output types. Ops with the ``opaque`` trait (extern calls) keep the types that
torch computed at capture time.
"""

from __future__ import annotations

import sympy

from cuvil_ir.graph_ir.nodes import Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types
from cuvil_ir.graph_ir.types import ScalarType, TensorType, Type
from cuvil_ir.symbolic import ShapeContext, UndecidableError, free_symbols


class VerifyError(ValueError):
    pass


def types_equal(a: Type, b: Type) -> bool:
    if isinstance(a, ScalarType) or isinstance(b, ScalarType):
        return a == b
    if a.dtype != b.dtype or a.device != b.device or a.rank != b.rank:
        return False
    for x, y in zip(a.shape, b.shape):
        if x != y and sympy.expand(sympy.sympify(x) - sympy.sympify(y)) != 0:
            return False
    return True


def verify(g: Graph) -> Graph:
    """Raise :class:`VerifyError` describing the first problem; return ``g``."""
    defined: set[Value] = set()
    names: set[str] = set()
    bound: set[sympy.Symbol] = set()
    for v in g.inputs:
        _define(v, defined, names, "graph input")
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                if not isinstance(d, (int, sympy.Symbol)):
                    raise VerifyError(f"input %{v.name}: dimension {d} must be an int or a symbol")
            bound |= free_symbols(v.type.shape)
    for a in g.assumptions:
        unbound = a.free_symbols - bound
        if unbound:
            raise VerifyError(f"assumption {a} uses unbound symbols {sorted(map(str, unbound))}")
    ctx = ShapeContext(None, g.assumptions)
    _verify_nodes(g.nodes, [defined], names, ctx, bound)
    for v in g.outputs:
        if v not in defined:
            raise VerifyError(f"graph returns %{v.name}, which is not defined")
    return g


def _define(v: Value, defined: set[Value], names: set[str], what: str) -> None:
    if v.name in names:
        raise VerifyError(f"{what} %{v.name} is defined twice")
    names.add(v.name)
    defined.add(v)


def _visible(v: Value, scopes: list[set[Value]]) -> bool:
    return any(v in s for s in scopes)


def _verify_nodes(
    nodes: tuple[Node, ...],
    scopes: list[set[Value]],
    names: set[str],
    ctx: ShapeContext,
    bound: set[sympy.Symbol],
) -> None:
    for n in nodes:
        where = f"{n.op} ({n.loc})" if n.loc else n.op
        for v in n.inputs:
            if not _visible(v, scopes):
                raise VerifyError(f"{where}: operand %{v.name} does not dominate its use")
        try:
            op = REGISTRY.get(n.op)
        except KeyError as e:
            raise VerifyError(f"{where}: {e.args[0]}") from None
        extra = set(n.attr_dict) - set(op.attr_names)
        missing = set(op.attr_names) - set(n.attr_dict)
        if extra or missing:
            raise VerifyError(
                f"{where}: attributes {sorted(extra)} are not declared, {sorted(missing)} are missing"
            )
        for r in n.regions:
            _verify_block(r, scopes, names, ctx, bound)
        if op.num_outputs is not None and len(n.outputs) != op.num_outputs:
            raise VerifyError(f"{where}: expected {op.num_outputs} results, got {len(n.outputs)}")
        for v in n.outputs:
            if isinstance(v.type, TensorType):
                unbound = free_symbols(v.type.shape) - bound
                if unbound:
                    raise VerifyError(
                        f"{where}: result type uses unbound symbols {sorted(map(str, unbound))}"
                    )
        if "opaque" not in op.traits and not n.regions:
            try:
                expected = infer_types(op, ctx, [v.type for v in n.inputs], n.attr_dict)
            except UndecidableError as e:
                raise VerifyError(f"{where}: {e} (missing assume line?)") from None
            except Exception as e:  # shape rules raise on bad operands
                raise VerifyError(f"{where}: shape rule failed: {e}") from e
            if len(expected) != len(n.outputs) or not all(
                types_equal(a, b.type) for a, b in zip(expected, n.outputs)
            ):
                got = ", ".join(str(v.type) for v in n.outputs)
                want = ", ".join(str(t) for t in expected)
                raise VerifyError(f"{where}: result types {got} do not match the op's rule: {want}")
        for v in n.outputs:
            _define(v, scopes[-1], names, f"{n.op} result")


def _verify_block(
    b: Block, scopes: list[set[Value]], names: set[str], ctx: ShapeContext, bound: set[sympy.Symbol]
) -> None:
    inner: set[Value] = set()
    for v in b.args:
        _define(v, inner, names, "block argument")
    _verify_nodes(b.nodes, [*scopes, inner], names, ctx, bound)
    for v in b.results:
        if not _visible(v, [*scopes, inner]):
            raise VerifyError(f"block yields %{v.name}, which is not visible there")
