"""Capture of Python control flow as Graph IR regions (``if``, ``while``, ``for``).

Converted code (see :mod:`cuvil.frontend.control_flow`) turns each convertible
statement into branch/body functions whose parameters and results are the
variables the statement assigns. When the condition is a Python value the
hooks simply run Python; when it is a size predicate (``torch.SymBool``) or a
tensor, the functions are traced once each inside a region and one structured
op is recorded:

- ``if`` on a size predicate keeps both branches; a result dimension that
  differs between them becomes ``Piecewise((then, pred), (else, True))``, so one
  artifact serves both sides of the threshold without recompiling;
- ``if`` on a tensor decides at run time; both branches must agree on shapes;
- ``while`` on a tensor carries the assigned tensors through the loop;
- ``for`` over a range with a symbolic (or large) trip count binds the index to a
  loop-local size symbol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.nodes import Node, Value
from cuvil_ir.graph_ir.types import TensorType
from cuvil_ir.symbolic import canonical, prove, symbol

#: constant ranges up to this many iterations are unrolled
UNROLL_LIMIT = 16


class Undefined:
    """A variable assigned on only some paths of a captured ``if``; any use is an error."""

    __slots__ = ("name", "loc")

    def __init__(self, name: str, loc: SourceLoc | None) -> None:
        self.name = name
        self.loc = loc

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise CompileError(
            f"variable {self.name!r} is used where it may not be assigned: it is assigned only on "
            "some paths of this statement (one branch of an `if`, or only inside a loop body)",
            self.loc,
            f"assign {self.name!r} on every path (in both branches, or before the statement)",
        )

    __getattr__ = _fail  # type: ignore[assignment]
    __bool__ = __add__ = __radd__ = __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = _fail
    __matmul__ = __getitem__ = __call__ = __iter__ = __len__ = __index__ = __float__ = _fail

    def __repr__(self) -> str:
        return f"<undefined {self.name}>"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for a in pytree.tree_leaves((args, kwargs)):
            if isinstance(a, Undefined):
                a._fail()
        raise AssertionError("unreachable")


def _flatten(out: Any) -> tuple[list[Any], Any]:
    return pytree.tree_flatten(out, is_leaf=lambda x: isinstance(x, Undefined))


def _pred_value(tracer: Tracer, cond: Any, loc: SourceLoc) -> tuple[Value, sympy.Basic | None]:
    if isinstance(cond, torch.SymBool):
        expr = canonical(tracer.sym(cond))
        return tracer.const(expr), expr
    assert isinstance(cond, TensorProxy)
    shape = cond.ir_type.shape
    if not all(prove(sympy.Eq(d, 1)) for d in shape):
        raise CompileError(
            f"the condition is a tensor of shape {[str(d) for d in shape]}; it must have one element",
            loc,
            "reduce it first, e.g. `if (x > 0).any():`",
        )
    return tracer.value_of(cond), None


def static_truth(tracer: Tracer, cond: torch.SymBool) -> bool | None:
    """The value of a size predicate when the sizes decide it without a guard."""
    return tracer.ctx.prove(canonical(tracer.sym(cond)))


def capture_if(
    tracer: Tracer,
    cond: Any,
    then_fn: Callable[..., Any],
    else_fn: Callable[..., Any],
    values: Sequence[Any],
    loc: SourceLoc,
) -> Any:
    pred, pred_expr = _pred_value(tracer, cond, loc)
    outs = []
    for fn, fact in ((then_fn, pred_expr), (else_fn, None if pred_expr is None else sympy.Not(pred_expr))):
        if fact is not None:
            tracer.ctx.path.append(canonical(fact))
        try:
            with tracer.mirror.branch(), tracer.region() as region:
                out = fn(*values)
                leaves, spec = _flatten(out)
                yielded = {i: tracer.value_of(x) for i, x in enumerate(leaves) if isinstance(x, TensorProxy)}
                tracer.sync()  # the branch's facts, while its condition is on the path
        finally:
            if fact is not None:
                tracer.ctx.path.pop()
        outs.append((region, leaves, spec, yielded))
    (then_r, then_leaves, then_spec, then_y), (else_r, else_leaves, else_spec, else_y) = outs
    if then_spec != else_spec:
        raise CompileError(
            "the branches of this `if` produce differently structured values",
            loc,
            "make both branches assign/return the same kinds of values",
        )
    result_types = []
    merged: list[Any] = []
    both = [i for i in then_y if i in else_y]
    then_r.results = tuple(then_y[i] for i in both)
    else_r.results = tuple(else_y[i] for i in both)
    for a, b in zip(then_leaves, else_leaves):
        if isinstance(a, Undefined) or isinstance(b, Undefined):
            merged.append(a if isinstance(a, Undefined) else b)
        elif isinstance(a, TensorProxy) and isinstance(b, TensorProxy):
            result_types.append(_join(a.ir_type, b.ir_type, pred_expr, loc))
            merged.append(None)
        elif isinstance(a, TensorProxy) or isinstance(b, TensorProxy):
            raise CompileError("one branch of this `if` produces a tensor where the other does not", loc)
        elif _same(tracer, a, b):
            merged.append(a)
        else:
            raise CompileError(
                f"the branches of this `if` produce different Python values ({a!r} and {b!r})",
                loc,
                "keep Python values equal in both branches, or make them tensors",
            )
    outputs = tuple(tracer._fresh(t) for t in result_types)
    tracer.nodes.append(Node("if", (pred,), outputs, (), (then_r.block, else_r.block), loc=tracer.loc()))
    handles = iter(tracer.wrap(v) for v in outputs)
    final = [next(handles) if m is None else m for m in merged]
    return pytree.tree_unflatten(final, then_spec)


def _same(tracer: Tracer, a: Any, b: Any) -> bool:
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return bool(prove(sympy.Eq(tracer.sym(a), tracer.sym(b))))
    try:
        return bool(a is b or a == b)
    except Exception:
        return False


def _join(a: TensorType, b: TensorType, pred: sympy.Basic | None, loc: SourceLoc) -> TensorType:
    if a.dtype != b.dtype or a.device != b.device or a.rank != b.rank:
        raise CompileError(f"the branches of this `if` produce tensors of different types: {a} and {b}", loc)
    dims = []
    for x, y in zip(a.shape, b.shape):
        if prove(sympy.Eq(x, y)):
            dims.append(x)
        elif pred is not None:
            dims.append(sympy.Piecewise((x, pred), (y, True)))
        else:
            raise CompileError(
                f"the branches of this `if` on a tensor value produce different shapes: {a} and {b}",
                loc,
                "both branches must produce tensors of the same shape when the condition is a tensor",
            )
    return a.replace(shape=tuple(dims))


def _carried(values: Sequence[Any]) -> tuple[list[Any], Any, list[int]]:
    leaves, spec = _flatten(tuple(values))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, TensorProxy)]
    return leaves, spec, slots


def _rebuild(leaves: list[Any], spec: Any, slots: list[int], handles: Sequence[Any]) -> tuple[Any, ...]:
    new = list(leaves)
    for i, h in zip(slots, handles):
        new[i] = h
    out: tuple[Any, ...] = pytree.tree_unflatten(new, spec)
    return out


def _check_body(
    tracer: Tracer, kind: str, names: Sequence[str], before: list[Any], after: list[Any], loc: SourceLoc
) -> None:
    for i, (a, b) in enumerate(zip(before, after)):
        name = names[i] if i < len(names) else f"#{i}"
        if isinstance(a, TensorProxy):
            if not isinstance(b, TensorProxy):
                raise CompileError(f"`{kind}` body turns the tensor {name!r} into a {type(b).__name__}", loc)
            ta, tb = a.ir_type, b.ir_type
            same = (
                ta.dtype == tb.dtype
                and ta.rank == tb.rank
                and all(prove(sympy.Eq(x, y)) for x, y in zip(ta.shape, tb.shape))
            )
            if not same:
                raise CompileError(
                    f"`{kind}` body changes the type of {name!r} from {ta} to {tb}",
                    loc,
                    "a captured loop must keep the shape and dtype of what it carries",
                )
        elif not _same(tracer, a, b):
            raise CompileError(
                f"`{kind}` on a tensor/size condition changes the Python value {name!r} ({a!r} -> {b!r})",
                loc,
                "only tensors can change from one iteration to the next; make it a tensor",
            )


def _trace_body(
    tracer: Tracer,
    kind: str,
    body_fn: Callable[..., Any],
    lead: tuple[Any, ...],
    types: list[TensorType],
    leaves: list[Any],
    spec: Any,
    slots: list[int],
    names: Sequence[str],
    loc: SourceLoc,
) -> Any:
    """Trace a loop body once, over block arguments standing for the carried tensors."""
    with tracer.region(types) as body_r:
        out = body_fn(*lead, *_rebuild(leaves, spec, slots, body_r.args))
        new_leaves, new_spec = _flatten(tuple(out))
        if new_spec != spec:
            raise CompileError(f"the `{kind}` body changes the structure of its variables", loc)
        _check_body(tracer, kind, names, leaves, new_leaves, loc)
        body_r.finish([new_leaves[i] for i in slots])
    return body_r


def _emit_loop(
    tracer: Tracer,
    op: str,
    lead: tuple[Value, ...],
    attrs: tuple[tuple[str, Any], ...],
    regions: tuple[Any, ...],
    types: list[TensorType],
    leaves: list[Any],
    spec: Any,
    slots: list[int],
) -> tuple[Any, ...]:
    """Record a loop op over the carried tensors; Python values come back unchanged."""
    init = tuple(tracer.value_of(leaves[i]) for i in slots)
    outputs = tuple(tracer._fresh(t) for t in types)
    blocks = tuple(r.block for r in regions)
    tracer.nodes.append(Node(op, (*lead, *init), outputs, attrs, blocks, loc=tracer.loc()))
    return _rebuild(leaves, spec, slots, [tracer.wrap(v) for v in outputs])


def capture_while(
    tracer: Tracer,
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    values: Sequence[Any],
    names: Sequence[str],
    loc: SourceLoc,
) -> tuple[Any, ...]:
    leaves, spec, slots = _carried(values)
    types = [leaves[i].ir_type for i in slots]
    with tracer.region(types) as cond_r:
        c = cond_fn(*_rebuild(leaves, spec, slots, cond_r.args))
        if not isinstance(c, (TensorProxy, torch.SymBool)):
            raise CompileError("the `while` condition stops depending on tensors inside the loop", loc)
        pred, _ = _pred_value(tracer, c, loc)
        cond_r.results = (pred,)
    body_r = _trace_body(tracer, "while", body_fn, (), types, leaves, spec, slots, names, loc)
    return _emit_loop(tracer, "while", (), (), (cond_r, body_r), types, leaves, spec, slots)


class SymRange:
    """``range(n)`` with a symbolic bound: a ``for`` over it becomes a structured loop.

    Any other use iterates concretely, specialising the bounds (with a guard).
    """

    def __init__(self, *args: Any) -> None:
        r = slice(*args)
        self.start = 0 if r.start is None else r.start
        self.stop = r.stop
        self.step = 1 if r.step is None else r.step

    def concrete(self) -> range:
        return range(int(self.start), int(self.stop), int(self.step))

    def __iter__(self) -> Any:
        return iter(self.concrete())

    def __len__(self) -> int:
        return len(self.concrete())

    def __getitem__(self, i: Any) -> Any:
        return self.concrete()[i]


def capture_for(
    tracer: Tracer,
    rng: SymRange | range,
    body_fn: Callable[..., Any],
    values: Sequence[Any],
    names: Sequence[str],
    loc: SourceLoc,
) -> tuple[Any, ...]:
    leaves, spec, slots = _carried(values)
    types = [leaves[i].ir_type for i in slots]
    tracer.loops += 1
    var = symbol(f"loop{tracer.loops}")
    bounds = [
        tracer.sym(b) if isinstance(b, torch.SymInt) else int(b) for b in (rng.start, rng.stop, rng.step)
    ]
    if bounds[2] == 0:
        raise CompileError("range() step must not be zero", loc)
    assert tracer.ctx.hints is not None
    tracer.ctx.hints[var] = tracer.ctx.hint(bounds[0])
    if bounds[2] != 1:
        raise CompileError("a captured `for` over a range needs step 1 for now", loc, "iterate with step 1")
    if not isinstance(bounds[0], int):
        tracer.ctx.decide(sympy.Ge(bounds[0], 0), "a captured loop index starts at a size >= 0")
    tracer.ctx.local_symbols[var] = (bounds[0], bounds[1] - 1)
    try:
        index = tracer.size(var)
        body_r = _trace_body(tracer, "for", body_fn, (index,), types, leaves, spec, slots, names, loc)
    finally:
        del tracer.ctx.local_symbols[var]
    consts = tuple(tracer.const(b) for b in bounds)
    attrs = (("var", var.name),)
    return _emit_loop(tracer, "for", consts, attrs, (body_r,), types, leaves, spec, slots)


__all__ = [
    "UNROLL_LIMIT",
    "SymRange",
    "Undefined",
    "capture_for",
    "capture_if",
    "capture_while",
]
