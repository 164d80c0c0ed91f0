"""Capture of sizes computed from tensor data: ``nonzero``'s row count, ``int(mask.sum())``.

Such a size is a fresh symbol (``u0``) without an example value; see [Note:
data-dependent sizes] in :mod:`cuvil_ir.graph_ir.ops.core` and
docs/control-flow-and-dynamic-shapes.md. Here: ``int(t)``/``t.item()`` becomes a
``bind_size`` node, facts torch needs about such sizes become ``assert_size`` nodes
(checked when they run, never assumed), ``min``/``max`` of them stay symbolic, and
torch refusing to decide on one in user Python is a located error.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import sympy
import torch

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer_view import TracerView
from cuvil_ir.graph_ir.nodes import AttrValue, Node, Value
from cuvil_ir.graph_ir.ops import ShapeError
from cuvil_ir.graph_ir.registry import REGISTRY, infer_types
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.graph_ir.unbacked import defined_symbols
from cuvil_ir.symbolic import canonical, expr_str

#: what to do when something needs a fact about such a size
HINT = (
    "a size computed from tensor data (nonzero, x[mask], int(t)) is known only when the code runs: "
    "use it where no decision about it is needed (broadcast against 1 or an equal size, reduce "
    "over it, torch.sym_min/sym_max for min/max)"
)
#: the concrete size a proxy reports for a size computed from tensor data (no code reads
#: it: shapes are answered from the IR type)
_PLACEHOLDER = 2


def data_size(tracer: TracerView, t: Any, what: str) -> Any:
    """``int(t)``/``t.item()`` of a one-element integer tensor: a new size symbol, bound
    when the compiled code runs (a ``bind_size`` node), as a ``torch.SymInt``."""
    v = tracer.value_of(t)
    if not isinstance(v.type, TensorType) or v.type.dtype.is_floating or v.type.dtype.is_complex:
        raise CompileError(
            f"`{what}` needs the value of a tensor, which is only known when the compiled code runs",
            tracer.source_loc(),
            f"keep the computation in tensors; only an integer tensor's value can be used (as a "
            f"size), and this is a {v.type}",
        )
    ours, value = tracer.mirror.new_size()
    attrs: tuple[tuple[str, AttrValue], ...] = (("symbol", ours.name),)
    try:
        infer_types(REGISTRY.get("bind_size"), tracer.ctx, [v.type], dict(attrs))
    except ShapeError as e:
        raise CompileError(str(e), tracer.source_loc(), "use a one-element tensor (`t.sum()`)") from None
    out = tracer._fresh(ScalarType(ScalarKind.int))
    tracer.nodes.append(Node("bind_size", (v,), (out,), attrs, loc=tracer.loc()))
    tracer.seen_data_sizes.add(ours)
    assert_sizes(tracer, "int() of a tensor")
    return value


def example_dim(tracer: TracerView, d: Any) -> int:
    """The example value of size ``d``, with a placeholder for sizes computed from data."""
    if isinstance(d, int):
        return d
    data = free(d) & set(tracer.mirror.unbacked)
    return tracer.ctx.hint(d.xreplace({s: _PLACEHOLDER for s in data}) if data else d)


@contextlib.contextmanager
def guards(tracer: TracerView, loc: SourceLoc | None) -> Iterator[None]:
    """torch refusing to decide on a size computed from tensor data (``float(n)``,
    ``range(n)`` unrolled ...) in the Python code run here is the user's located error."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        yield
    except GuardOnDataDependentSymNode as e:
        raise CompileError(
            f"this needs the value of {sympy.sympify(e.cond).xreplace(tracer.mirror.theirs_to_ours)}, "
            "a size computed from tensor data, which is known only when the compiled code runs",
            loc,
            HINT,
        ) from None


def builtin(tracer: TracerView, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``int(tensor)``, and ``min``/``max`` of a size computed from tensor data (which no
    example value can decide: ``torch.sym_min``); NotImplemented for any other call."""
    if fn is int and len(args) == 1 and not kwargs and isinstance(args[0], TensorProxy):
        return data_size(tracer, args[0], "int")
    if fn in (min, max) and len(args) >= 2 and not kwargs:
        unbacked = set(tracer.mirror.unbacked)
        if all(isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool) for a in args) and any(
            isinstance(a, torch.SymInt) and free(tracer.sym(a)) & unbacked for a in args
        ):
            return functools.reduce(torch.sym_min if fn is min else torch.sym_max, args)
    return NotImplemented


def assert_sizes(tracer: TracerView, why: str) -> None:
    """Facts torch needed about data-dependent sizes become ``assert_size`` nodes,
    checked when the compiled code runs (never assumed).

    A fact about a size no node of the graph binds is left to the call that made it:
    such a size lives only inside one extern call (``narrow(x, 0, t, 2)`` reads ``t``
    into ``u0`` and checks ``u0 + 2 <= x.shape[0]``; ``combinations`` checks that its
    ``masked_select`` rows agree). The result types never name it (``check_bindable``),
    and the extern runs the same torch code when the compiled code runs, which makes the
    same check on the real value (the fake kernel's check is that code's own); the graph
    could not evaluate the fact anyway."""
    facts = tracer.mirror.runtime_asserts()
    unbound = set(tracer.mirror.unbacked) - tracer.seen_data_sizes
    for fact in facts:
        fact = canonical(fact)
        if free(fact) & unbound:
            continue
        proved = tracer.ctx.prove(fact)
        if proved:
            continue
        if proved is False:
            raise CompileError(f"the size fact {expr_str(fact)} never holds ({why})", tracer.source_loc())
        tracer.nodes.append(Node("assert_size", (), (), (("fact", fact), ("reason", why)), loc=tracer.loc()))


def check_bindable(tracer: TracerView, target: str, out_types: Sequence[Type]) -> None:
    """A new data-dependent size must be a whole dim of the result, where the runtime
    reads it (cuvil_ir.graph_ir.unbacked)."""
    bound = set(tracer.ctx.hints or ()) | set(tracer.ctx.local_symbols) | tracer.seen_data_sizes
    for t in out_types:
        if not isinstance(t, TensorType):
            continue
        for d in t.shape:
            if isinstance(d, sympy.Symbol):
                tracer.seen_data_sizes.add(d)
                bound.add(d)
        for d in t.shape:
            if not isinstance(d, int) and free(d) - bound:
                raise CompileError(
                    f"{target}: the result's size {d} is computed from tensor data in a form the "
                    "compiled code cannot read back from the result",
                    tracer.source_loc(),
                )


def binding_nodes(nodes: Sequence[Node], inputs: Sequence[Value]) -> set[int]:
    """Positions of the nodes that bind a data-dependent size: dead code elimination
    keeps them, since later nodes may use the size without their results."""
    bound = {s for v in inputs if isinstance(v.type, TensorType) for s in free(v.type.shape)}
    out = set()
    for k, node in enumerate(nodes):
        defined = defined_symbols(node, bound)
        if defined:
            out.add(k)
            bound |= {b.symbol for b in defined}
    return out


def free(x: Any) -> set[sympy.Symbol]:
    if isinstance(x, tuple):
        return set().union(*(free(d) for d in x))
    return {s for s in sympy.sympify(x).free_symbols if isinstance(s, sympy.Symbol)}


__all__ = [
    "HINT",
    "assert_sizes",
    "binding_nodes",
    "builtin",
    "check_bindable",
    "data_size",
    "example_dim",
    "guards",
]
