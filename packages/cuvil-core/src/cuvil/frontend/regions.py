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
from cuvil.frontend.numbers import NumberProxy, as_tensor, carried_type, number
from cuvil.frontend.numbers import kind as kind_of
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.nodes import Node, Value
from cuvil_ir.graph_ir.types import DType, TensorType
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
    device = _device(tracer, [cond, *pytree.tree_leaves(tuple(values))])
    facts = (pred_expr, None if pred_expr is None else sympy.Not(pred_expr))
    promoted: dict[int, TensorType] = {}
    first: tuple[list[Any], list[Any]] = ([], [])
    while True:  # twice at most: the second time with the numbers the branches set differently
        outs = [
            _trace_branch(tracer, fn, fact, values, promoted, loc)
            for fn, fact in zip((then_fn, else_fn), facts)
        ]
        (then_r, then_leaves, then_spec, then_y), (else_r, else_leaves, else_spec, else_y) = outs
        if then_spec != else_spec:
            raise CompileError(
                "the branches of this `if` produce differently structured values",
                loc,
                "make both branches assign/return the same kinds of values",
            )
        more = _carries(tracer, then_leaves, else_leaves, device, typed=False)
        if not more or promoted:
            break
        promoted, first = more, (then_leaves, else_leaves)
    # a variable that is a Python number on both paths stays one (see numbers.py)
    numbers = {i for i in promoted if kind_of(first[0][i]) is not None and kind_of(first[1][i]) is not None}
    result_types = []
    as_numbers: list[bool] = []  # per result of the `if`: whether it leaves as a Python number
    merged: list[Any] = []
    both = [i for i in then_y if i in else_y]
    then_r.results = tuple(then_y[i] for i in both)
    else_r.results = tuple(else_y[i] for i in both)
    for i, (a, b) in enumerate(zip(then_leaves, else_leaves)):
        if isinstance(a, Undefined) or isinstance(b, Undefined):
            merged.append(a if isinstance(a, Undefined) else b)
        elif isinstance(a, TensorProxy) and isinstance(b, TensorProxy):
            result_types.append(_join(a.ir_type, b.ir_type, pred_expr, loc))
            as_numbers.append(i in numbers or (isinstance(a, NumberProxy) and isinstance(b, NumberProxy)))
            merged.append(_RESULT)
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
    handles = iter(number(tracer.wrap(v)) if n else tracer.wrap(v) for v, n in zip(outputs, as_numbers))
    final = [next(handles) if m is _RESULT else m for m in merged]
    return pytree.tree_unflatten(final, then_spec)


def _trace_branch(
    tracer: Tracer,
    fn: Callable[..., Any],
    fact: sympy.Basic | None,
    values: Sequence[Any],
    promoted: dict[int, TensorType],
    loc: SourceLoc,
) -> tuple[Any, list[Any], Any, dict[int, Value]]:
    """Trace one branch in a region; ``promoted`` variables leave it as tensors of those types."""
    if fact is not None:
        tracer.ctx.path.append(canonical(fact))
    try:
        with tracer.mirror.branch(), tracer.region() as region:
            leaves, spec = _flatten(fn(*values))
            for i, t in promoted.items():
                leaves[i] = as_tensor(tracer, leaves[i], t, loc)
            yielded = {i: tracer.value_of(x) for i, x in enumerate(leaves) if isinstance(x, TensorProxy)}
            tracer.sync()  # the branch's facts, while its condition is on the path
    finally:
        if fact is not None:
            tracer.ctx.path.pop()
    return region, leaves, spec, yielded


#: where a result of the `if` op goes among the merged variables
_RESULT = object()


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


def _device(tracer: Tracer, leaves: Sequence[Any]) -> str:
    """Where carried Python numbers live: with the tensors they meet."""
    for x in leaves:
        if isinstance(x, TensorProxy):
            return x.ir_type.device
    return tracer.inputs[0].type.device if tracer.inputs else "cpu"  # type: ignore[attr-defined]


def _needs_carry(tracer: Tracer, a: Any, b: Any) -> bool:
    """Do ``a`` and ``b`` (a variable on two paths) differ in a way a tensor can carry?"""
    if isinstance(a, Undefined) or isinstance(b, Undefined):
        return False
    if isinstance(a, TensorProxy) and isinstance(b, TensorProxy):
        return (
            isinstance(a, NumberProxy) and isinstance(b, NumberProxy) and a.ir_type.dtype != b.ir_type.dtype
        )
    return isinstance(a, TensorProxy) or isinstance(b, TensorProxy) or not _same(tracer, a, b)


def _carries(
    tracer: Tracer, before: list[Any], after: list[Any], device: str, typed: bool = True
) -> dict[int, TensorType]:
    """The variables that must become (wider) tensors so one type carries both values
    (see :mod:`cuvil.frontend.numbers`); with ``typed``, not those whose ``before`` is a
    tensor of that type already (a loop's block argument)."""
    more = {}
    for i, (a, b) in enumerate(zip(before, after)):
        if _needs_carry(tracer, a, b):
            t = carried_type(a, b, device)
            if t is not None and not (typed and isinstance(a, TensorProxy) and t == a.ir_type):
                more[i] = t
    return more


def _number_arg(init: Any, t: TensorType) -> bool:
    """Whether a carried variable enters the loop body as a Python number."""
    return kind_of(init) is not None and t.rank == 0 and t.dtype in (DType.bool, DType.i64, DType.f64)


class _Carry:
    """The variables a captured loop carries: the tensors, and the Python numbers it
    changes (``promoted``: as tensors of these types)."""

    def __init__(self, values: Sequence[Any], promoted: dict[int, TensorType]) -> None:
        self.leaves, self.spec = _flatten(tuple(values))
        self.promoted = promoted
        self.slots = [i for i, x in enumerate(self.leaves) if isinstance(x, TensorProxy) or i in promoted]
        self.types = [promoted[i] if i in promoted else self.leaves[i].ir_type for i in self.slots]
        self.numbers = {i for i, t in zip(self.slots, self.types) if _number_arg(self.leaves[i], t)}

    def rebuild(self, handles: Sequence[Any], numbers: set[int] | None = None) -> tuple[Any, ...]:
        numbers = self.numbers if numbers is None else numbers
        new = list(self.leaves)
        for i, h in zip(self.slots, handles):
            new[i] = number(h) if i in numbers else h
        out: tuple[Any, ...] = pytree.tree_unflatten(new, self.spec)
        return out


def _check_body(
    tracer: Tracer, kind: str, names: Sequence[str], before: list[Any], after: list[Any], loc: SourceLoc
) -> None:
    for i, (a, b) in enumerate(zip(before, after)):
        name = names[i] if i < len(names) else f"#{i}"
        if isinstance(a, Undefined):
            continue  # assigned in the body before any use: a temporary, not carried
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
                "only tensors and Python numbers can change from one iteration to the next; make it a tensor",
            )


def _trace_body(
    tracer: Tracer,
    kind: str,
    body_fn: Callable[..., Any],
    lead: tuple[Any, ...],
    carry: _Carry,
    names: Sequence[str],
    loc: SourceLoc,
) -> tuple[Any, set[int], dict[int, TensorType]]:
    """Trace a loop body once, over block arguments standing for the carried values.

    Returns the region, the carried variables that leave it as Python numbers, and
    the variables that need (wider) tensor types, in which case the region is
    discarded and the body traced again (see :mod:`cuvil.frontend.numbers`).
    """
    device = _device(tracer, carry.leaves)
    with tracer.region(carry.types) as body_r:
        inner = carry.rebuild(body_r.args)
        before, _ = _flatten(inner)
        out = body_fn(*lead, *inner)
        after, new_spec = _flatten(tuple(out))
        if new_spec != carry.spec:
            raise CompileError(f"the `{kind}` body changes the structure of its variables", loc)
        more = _carries(tracer, before, after, device)
        if more:
            return body_r, set(), more
        numbers = {i for i in carry.numbers if kind_of(after[i]) is not None}
        for i, t in zip(carry.slots, carry.types):
            after[i] = as_tensor(tracer, after[i], t, loc)  # `x = 0` where x is a tensor
        _check_body(tracer, kind, names, before, after, loc)
        body_r.finish([after[i] for i in carry.slots])
    return body_r, numbers, {}


def _carry_loop(
    tracer: Tracer,
    values: Sequence[Any],
    loc: SourceLoc,
    trace: Callable[[_Carry], tuple[Any, set[int], dict]],
) -> tuple[_Carry, Any, set[int]]:
    """Trace a loop until the types of what it carries are stable: each round widens
    the variables the body changes (a Python number becomes a 0-d tensor ...)."""
    promoted: dict[int, TensorType] = {}
    for _ in range(3 * len(_flatten(tuple(values))[0]) + 1):  # each round widens a variable
        carry = _Carry(values, promoted)
        regions, numbers, more = trace(carry)
        if not more:
            return carry, regions, numbers
        promoted = {**promoted, **more}
    raise CompileError("internal error: the types a captured loop carries do not settle", loc)


def _emit_loop(
    tracer: Tracer,
    op: str,
    lead: tuple[Value, ...],
    attrs: tuple[tuple[str, Any], ...],
    regions: tuple[Any, ...],
    carry: _Carry,
    numbers: set[int],
    loc: SourceLoc,
) -> tuple[Any, ...]:
    """Record a loop op over the carried values; other Python values come back unchanged."""
    init = tuple(
        tracer.value_of(as_tensor(tracer, carry.leaves[i], t, loc)) for i, t in zip(carry.slots, carry.types)
    )
    outputs = tuple(tracer._fresh(t) for t in carry.types)
    blocks = tuple(r.block for r in regions)
    tracer.nodes.append(Node(op, (*lead, *init), outputs, attrs, blocks, loc=tracer.loc()))
    return carry.rebuild([tracer.wrap(v) for v in outputs], numbers)


def capture_while(
    tracer: Tracer,
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    values: Sequence[Any],
    names: Sequence[str],
    loc: SourceLoc,
) -> tuple[Any, ...]:
    def trace(carry: _Carry) -> tuple[Any, set[int], dict[int, TensorType]]:
        with tracer.region(carry.types) as cond_r:
            c = cond_fn(*carry.rebuild(cond_r.args))
            if not isinstance(c, (TensorProxy, torch.SymBool)):
                raise CompileError("the `while` condition stops depending on tensors inside the loop", loc)
            pred, _ = _pred_value(tracer, c, loc)
            cond_r.results = (pred,)
        body_r, numbers, more = _trace_body(tracer, "while", body_fn, (), carry, names, loc)
        return (cond_r, body_r), numbers, more

    carry, regions, numbers = _carry_loop(tracer, values, loc, trace)
    return _emit_loop(tracer, "while", (), (), regions, carry, numbers, loc)


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

        def trace(carry: _Carry) -> tuple[Any, set[int], dict[int, TensorType]]:
            body_r, numbers, more = _trace_body(tracer, "for", body_fn, (index,), carry, names, loc)
            return (body_r,), numbers, more

        carry, regions, numbers = _carry_loop(tracer, values, loc, trace)
    finally:
        del tracer.ctx.local_symbols[var]
    consts = tuple(tracer.const(b) for b in bounds)
    attrs = (("var", var.name),)
    return _emit_loop(tracer, "for", consts, attrs, regions, carry, numbers, loc)


__all__ = [
    "UNROLL_LIMIT",
    "SymRange",
    "Undefined",
    "capture_for",
    "capture_if",
    "capture_while",
]
