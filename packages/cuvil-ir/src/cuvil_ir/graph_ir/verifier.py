"""Graph IR verifier: SSA, dominance, op schema, and types.

Types are checked by replaying each op's shape rule under the graph's recorded
assumptions (no example values), and comparing symbolically with the recorded
output types. Ops with the ``opaque`` trait (extern calls) keep the types that
torch computed at capture time.

Ops that carry regions (structured control flow) declare a ``check_regions``
hook instead of a shape rule: it asks a :class:`RegionChecker` to verify each
block (block arguments are defined in the block, and a block sees the values
of the blocks that enclose it) and then checks the types the blocks yield.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types
from cuvil_ir.graph_ir.types import ScalarType, TensorType, Type
from cuvil_ir.graph_ir.unbacked import defined_symbols
from cuvil_ir.symbolic import ShapeContext, UndecidableError, canonical, free_symbols, with_equalities


class VerifyError(ValueError):
    pass


def dims_equal(x: Any, y: Any) -> bool:
    """Symbolic equality of two dimensions (``expand(x - y) == 0``)."""
    return bool(x == y or sympy.expand(sympy.sympify(x) - sympy.sympify(y)) == 0)


def types_equal(a: Type, b: Type, same: Callable[[Any, Any], bool] = dims_equal) -> bool:
    if isinstance(a, ScalarType) or isinstance(b, ScalarType):
        return a == b
    if a.dtype != b.dtype or a.device != b.device or a.rank != b.rank:
        return False
    return all(same(x, y) for x, y in zip(a.shape, b.shape))


def _dims_equal_under(ctx: ShapeContext, x: Any, y: Any) -> bool:
    """Equal, or equal by the graph's assumptions (a rewrite keeps the replaced node's
    result, typed ``hidden_0`` where the new op's rule says ``q_2``, and ``Eq(hidden_0, q_2)``
    is assumed)."""
    if dims_equal(x, y):
        return True
    try:
        return ctx.decide(sympy.Eq(sympy.sympify(x), sympy.sympify(y)))
    except UndecidableError:
        return False


def attr_symbols(value: AttrValue) -> frozenset[sympy.Symbol]:
    """The size symbols an attribute value mentions."""
    if isinstance(value, sympy.Basic):
        return frozenset(s for s in value.free_symbols if isinstance(s, sympy.Symbol))
    if isinstance(value, tuple):
        return frozenset().union(*(attr_symbols(v) for v in value))
    if isinstance(value, KV):
        return frozenset().union(*(attr_symbols(v) for _, v in value.items))
    return frozenset()


def _type_symbols(t: Type) -> frozenset[sympy.Symbol]:
    return free_symbols(t.shape) if isinstance(t, TensorType) else frozenset()


def block_symbols(b: Block) -> frozenset[sympy.Symbol]:
    """The size symbols mentioned anywhere in ``b``: attributes and types, nested blocks included."""
    out: set[sympy.Symbol] = set()
    for v in b.args:
        out |= _type_symbols(v.type)
    for n in b.nodes:
        for _, a in n.attrs:
            out |= attr_symbols(a)
        for v in n.outputs:
            out |= _type_symbols(v.type)
        for r in n.regions:
            out |= block_symbols(r)
    return frozenset(out)


def verify(g: Graph) -> Graph:
    """Raise :class:`VerifyError` describing the first problem; return ``g``."""
    state = _State()
    defined: set[Value] = set()
    bound: set[sympy.Symbol] = set()
    for v in g.inputs:
        state.define(v, defined, "graph input")
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                if not isinstance(d, (int, sympy.Symbol)):
                    raise VerifyError(f"input %{v.name}: dimension {d} must be an int or a symbol")
            bound |= free_symbols(v.type.shape)
    for a in g.assumptions:
        unbound = a.free_symbols - bound
        if unbound:
            raise VerifyError(f"assumption {a} uses unbound symbols {sorted(map(str, unbound))}")
    # facts the assumptions imply by chains of equal sizes count (a rewrite proves with them)
    ctx = ShapeContext(None, with_equalities(g.assumptions))
    state.nodes(g.nodes, [defined], ctx, frozenset(bound))
    for v in g.outputs:
        if v not in defined:
            raise VerifyError(f"graph returns %{v.name}, which is not defined")
    return g


def _visible(v: Value, scopes: list[set[Value]]) -> bool:
    return any(v in s for s in scopes)


def _where(n: Node) -> str:
    return f"{n.op} ({n.loc})" if n.loc else n.op


class _State:
    """What is shared across one verification: value names and each value's producer."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.producers: dict[Value, Node] = {}

    def define(self, v: Value, scope: set[Value], what: str) -> None:
        if v.name in self.names:
            raise VerifyError(f"{what} %{v.name} is defined twice")
        self.names.add(v.name)
        scope.add(v)

    def nodes(
        self,
        nodes: tuple[Node, ...],
        scopes: list[set[Value]],
        ctx: ShapeContext,
        bound: frozenset[sympy.Symbol],
    ) -> None:
        for n in nodes:
            self.node(n, scopes, ctx, bound)
            # a data-dependent size is bound from here on (see cuvil_ir.graph_ir.unbacked)
            defined = {b.symbol for b in defined_symbols(n, bound)}
            bound = bound | defined
            ctx.data_symbols |= defined

    def node(
        self, n: Node, scopes: list[set[Value]], ctx: ShapeContext, bound: frozenset[sympy.Symbol]
    ) -> None:
        where = _where(n)
        for v in n.inputs:
            if not _visible(v, scopes):
                raise VerifyError(f"{where}: operand %{v.name} does not dominate its use")
        try:
            op = REGISTRY.get(n.op)
        except KeyError as e:
            raise VerifyError(f"{where}: {e.args[0]}") from None
        extra = set(n.attr_dict) - set(op.attr_names)
        missing = set(op.required_attrs) - set(n.attr_dict)
        if extra or missing:
            raise VerifyError(
                f"{where}: attributes {sorted(extra)} are not declared, {sorted(missing)} are missing"
            )
        for k, a in n.attrs:
            unbound = attr_symbols(a) - bound
            if unbound:
                raise VerifyError(
                    f"{where}: attribute {k!r} uses unbound symbols {sorted(map(str, unbound))}"
                )
        if op.num_outputs is not None and len(n.outputs) != op.num_outputs:
            raise VerifyError(f"{where}: expected {op.num_outputs} results, got {len(n.outputs)}")
        defined = {b.symbol for b in defined_symbols(n, bound)}
        for v in n.outputs:
            unbound = _type_symbols(v.type) - bound - defined
            if unbound:
                raise VerifyError(f"{where}: result type uses unbound symbols {sorted(map(str, unbound))}")
        if op.check_regions is not None:
            checker = RegionChecker(self, n, scopes, ctx, bound)
            op.check_regions(n, checker)
            unchecked = [i for i in range(len(n.regions)) if i not in checker.checked]
            if unchecked:
                raise VerifyError(
                    f"{where}: region {unchecked[0]} was not verified by the op's check_regions"
                )
        elif n.regions:
            raise VerifyError(f"{where}: {n.op} takes no regions, got {len(n.regions)}")
        elif "opaque" not in op.traits:
            try:
                expected = infer_types(op, ctx, [v.type for v in n.inputs], n.attr_dict)
            except UndecidableError as e:
                raise VerifyError(f"{where}: {e} (missing assume line?)") from None
            except Exception as e:  # shape rules raise on bad operands
                raise VerifyError(f"{where}: shape rule failed: {e}") from e
            if len(expected) != len(n.outputs) or not all(
                types_equal(a, b.type, functools.partial(_dims_equal_under, ctx))
                for a, b in zip(expected, n.outputs)
            ):
                got = ", ".join(str(v.type) for v in n.outputs)
                want = ", ".join(str(t) for t in expected)
                raise VerifyError(f"{where}: result types {got} do not match the op's rule: {want}")
        for v in n.outputs:
            self.define(v, scopes[-1], f"{n.op} result")
            self.producers[v] = n

    def block(
        self,
        b: Block,
        scopes: list[set[Value]],
        ctx: ShapeContext,
        bound: frozenset[sympy.Symbol],
    ) -> None:
        inner: set[Value] = set()
        for v in b.args:
            unbound = _type_symbols(v.type) - bound
            if unbound:
                raise VerifyError(
                    f"block argument %{v.name}: type uses unbound symbols {sorted(map(str, unbound))}"
                )
            self.define(v, inner, "block argument")
        self.nodes(b.nodes, [*scopes, inner], ctx, bound)
        for v in b.results:
            if not _visible(v, [*scopes, inner]):
                raise VerifyError(f"block yields %{v.name}, which is not visible there")


class RegionChecker:
    """What an op's ``check_regions(node, checker)`` hook may ask of the verifier.

    The hook must call :meth:`block` once for each of the node's regions (the
    verifier checks that it did), then compare the types the blocks take and
    yield with the node's operands and results, raising :meth:`error`.
    """

    def __init__(
        self,
        state: _State,
        node: Node,
        scopes: list[set[Value]],
        ctx: ShapeContext,
        bound: frozenset[sympy.Symbol],
    ) -> None:
        self._state = state
        self._scopes = scopes
        self.node = node
        #: the shape context of the node's own scope
        self.ctx = ctx
        #: the size symbols bound where the node is
        self.bound = bound
        #: indices of the regions verified so far
        self.checked: list[int] = []

    def error(self, msg: str) -> VerifyError:
        return VerifyError(f"{_where(self.node)}: {msg}")

    def producer(self, v: Value) -> Node | None:
        """The node defining ``v`` (``None`` for graph inputs and block arguments)."""
        return self._state.producers.get(v)

    def block(
        self,
        b: Block,
        *,
        ranges: Mapping[sympy.Symbol, tuple[Any, Any] | None] | None = None,
        facts: Iterable[sympy.Basic] = (),
    ) -> None:
        """Verify region ``b`` of the node.

        ``ranges`` binds new size symbols inside the block (a loop index), each with
        its (lowest, highest) value when known; ``facts`` hold throughout the block
        (a branch condition). Both extend what shape rules inside may rely on.
        """
        index = next((i for i, r in enumerate(self.node.regions) if r is b and i not in self.checked), None)
        if index is None:
            raise self.error(
                "check_regions verified a block that is not one of the node's (unverified) regions"
            )
        self.checked.append(index)
        ranges = ranges or {}
        shadowed = set(ranges) & self.bound
        if shadowed:
            names = ", ".join(sorted(map(str, shadowed)))
            raise self.error(f"the block binds size symbols {names}, which are already bound here")
        path = [canonical(f) for f in facts]
        ctx = self.ctx
        local = {s: r for s, r in ranges.items() if r is not None}
        if path or local:
            ctx = ShapeContext(None, self.ctx.assumptions)
            ctx.local_symbols.update(self.ctx.local_symbols)
            ctx.local_symbols.update(local)
            ctx.data_symbols = self.ctx.data_symbols  # shared: a block may bind more
            ctx.path = [*self.ctx.path, *(f for f in path if f not in (sympy.true, sympy.false))]
        self._state.block(b, self._scopes, ctx, self.bound | frozenset(ranges))


__all__ = [
    "RegionChecker",
    "VerifyError",
    "attr_symbols",
    "block_symbols",
    "dims_equal",
    "types_equal",
    "verify",
]
