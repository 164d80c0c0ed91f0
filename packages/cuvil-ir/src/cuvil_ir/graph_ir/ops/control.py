"""Structured control flow: ``if``, ``for`` and ``while`` carry their code in regions.

    %r = if(%pred) (
      ^0() { ...; yield %a }              then: no arguments
      ^1() { ...; yield %b }              else: no arguments
    ) : T

``pred`` is a ``Scalar[bool]`` (typically a ``const`` holding a size predicate,
evaluated per call) or a tensor with exactly one element (its truth value at run
time). Each branch yields one value per result. A result matches both branches
(same kind, dtype, device and rank, equal dims); when ``pred`` is a size
predicate, a dim may instead be ``Piecewise((then_dim, pred), (else_dim, True))``.

    %c = for(%start, %stop, %step, %init...) {var = "i"} (
      ^0(%arg...: T...) { ...; yield %next... }
    ) : T...

``start``/``stop``/``step`` are ``Scalar[int]`` (usually ``const`` s, possibly size
expressions); the body runs once per value of ``range(start, stop, step)`` with
the size symbol named by ``var`` bound to it (visible in the body only: size
expressions of the body's attributes and types may use it). The body takes and
yields the carried values, whose types do not change from one iteration to the
next; the results are the final carried values (the initial ones after zero
iterations).

    %c = while(%init...) (
      ^0(%arg...: T...) { ...; yield %pred }     condition
      ^1(%arg...: T...) { ...; yield %next... }  body
    ) : T...

The condition block yields one ``Scalar[bool]`` or one-element tensor; the loop
runs the body while it is true.

The reference executor runs the regions itself, so ``reference`` is never called;
the frontend builds these nodes directly, so there are no torch captures and no
shape rule (``infer``): the verifier calls ``check_regions`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import AttrValue, Node, Value
from cuvil_ir.graph_ir.registry import Op
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, Type
from cuvil_ir.graph_ir.verifier import RegionChecker, block_symbols, dims_equal, types_equal
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError, symbol

CONTROL = frozenset({"control_flow"})
_INT = ScalarType(ScalarKind.int)
_BOOL = ScalarType(ScalarKind.bool)


def _no_rule(name: str) -> TypeError:
    return TypeError(f"{name}: result types come from its regions (the verifier calls check_regions)")


def _no_reference(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name} has regions: an executor runs them itself; there is no reference call"
    )


# -- helpers ------------------------------------------------------------------------------
def _constant(c: RegionChecker, v: Value) -> tuple[bool, AttrValue]:
    """``(True, value)`` when ``v`` is defined by a ``const`` node, else ``(False, None)``."""
    p = c.producer(v)
    if p is not None and p.op == "const":
        return True, p.attr("value")
    return False, None


def _size_const(c: RegionChecker, v: Value) -> Dim | None:
    """The int or size expression of a ``const`` operand; ``None`` when not a constant."""
    is_const, value = _constant(c, v)
    if is_const and isinstance(value, (int, sympy.Expr)) and not isinstance(value, bool):
        return value
    return None


def _is_predicate(ctx: ShapeContext, t: Type) -> bool:
    """A ``Scalar[bool]``, or a tensor that provably has exactly one element."""
    if isinstance(t, ScalarType):
        return t == _BOOL
    numel: Any = math.prod(t.shape) if t.shape else 1
    try:
        return bool(ctx.equal(numel, 1))
    except UndecidableError:
        return False


def _check_types(c: RegionChecker, what: str, got: Sequence[Value], want: Sequence[Type]) -> None:
    if len(got) != len(want):
        raise c.error(f"{what}: expected {len(want)} values, got {len(got)}")
    for i, (v, t) in enumerate(zip(got, want)):
        if not types_equal(v.type, t):
            raise c.error(f"{what} #{i} (%{v.name}) has type {v.type}, expected {t}")


def _merge_ok(out: Type, a: Type, b: Type, cond: sympy.Basic | None, ctx: ShapeContext | None = None) -> bool:
    """Is ``out`` the result type of an ``if`` whose branches yield ``a`` and ``b``? A
    dim the graph's assumptions pin down counts too (lowering's ``specialize`` writes
    ``1`` for a merged ``Piecewise((1, p), (x_0, True))`` assumed to be 1)."""
    if isinstance(out, ScalarType) or isinstance(a, ScalarType) or isinstance(b, ScalarType):
        return out == a == b
    if not (out.dtype == a.dtype == b.dtype and out.device == a.device == b.device):
        return False
    if not out.rank == a.rank == b.rank:
        return False
    for d, x, y in zip(out.shape, a.shape, b.shape):
        if dims_equal(d, x) and dims_equal(d, y):
            continue
        if cond is not None and dims_equal(d, sympy.Piecewise((x, cond), (y, True))):
            continue
        if (
            cond is not None
            and ctx is not None
            and _decided(ctx, sympy.Eq(d, sympy.Piecewise((x, cond), (y, True))))
        ):
            continue
        return False
    return True


def _decided(ctx: ShapeContext, fact: sympy.Basic) -> bool:
    try:
        return ctx.decide(fact)
    except UndecidableError:
        return False


def _sign(ctx: ShapeContext, step: Dim) -> int | None:
    """+1 / -1 for a provably positive / negative step, 0 for zero, None when unknown."""
    if isinstance(step, int):
        return (step > 0) - (step < 0)
    for cond, sign in ((sympy.Gt(step, 0), 1), (sympy.Lt(step, 0), -1), (sympy.Eq(step, 0), 0)):
        try:
            if ctx.decide(cond):
                return sign
        except UndecidableError:
            pass
    return None


# -- ops ----------------------------------------------------------------------------------
class If(Op):
    """``if(pred)`` with a then and an else region; see the module docstring."""

    name = "if"
    traits = CONTROL
    num_outputs = None

    @staticmethod
    def infer(ctx: ShapeContext, *inputs: Type) -> tuple[Type, ...]:
        raise _no_rule("if")

    @staticmethod
    def reference(*inputs: Any) -> Any:
        raise _no_reference("if")

    @staticmethod
    def check_regions(node: Node, c: RegionChecker) -> None:
        if len(node.inputs) != 1:
            raise c.error(f"expected one operand (the condition), got {len(node.inputs)}")
        (pred,) = node.inputs
        if not _is_predicate(c.ctx, pred.type):
            raise c.error(
                f"the condition %{pred.name}: {pred.type} is not a Scalar[bool] or a one-element tensor"
            )
        if len(node.regions) != 2:
            raise c.error(f"expected two regions (then, else), got {len(node.regions)}")
        then, other = node.regions
        if then.args or other.args:
            raise c.error("the branches take no block arguments")
        is_const, value = _constant(c, pred)
        cond = value if is_const and isinstance(value, sympy.Basic) and pred.type == _BOOL else None
        c.block(then, facts=(cond,) if cond is not None else ())
        c.block(other, facts=(sympy.Not(cond),) if cond is not None else ())
        for name, block in (("then", then), ("else", other)):
            if len(block.results) != len(node.outputs):
                raise c.error(
                    f"the {name} branch yields {len(block.results)} values for {len(node.outputs)} results"
                )
        for i, (out, a, b) in enumerate(zip(node.outputs, then.results, other.results)):
            if not _merge_ok(out.type, a.type, b.type, cond, c.ctx):
                piecewise = " (or Piecewise((then, pred), (else, True)) dims)" if cond is not None else ""
                raise c.error(
                    f"result #{i} has type {out.type}, which does not match the branches' {a.type} "
                    f"and {b.type}{piecewise}"
                )


class For(Op):
    """``for(start, stop, step, *init) {var}`` with a body region; see the module docstring."""

    name = "for"
    traits = CONTROL
    num_outputs = None

    @staticmethod
    def infer(ctx: ShapeContext, *inputs: Type, var: str) -> tuple[Type, ...]:
        raise _no_rule("for")

    @staticmethod
    def reference(*inputs: Any, **attrs: Any) -> Any:
        raise _no_reference("for")

    @staticmethod
    def check_regions(node: Node, c: RegionChecker) -> None:
        if len(node.inputs) < 3:
            raise c.error(f"expected operands (start, stop, step, *init), got {len(node.inputs)}")
        bounds, init = node.inputs[:3], node.inputs[3:]
        for what, v in zip(("start", "stop", "step"), bounds):
            if v.type != _INT:
                raise c.error(f"{what} %{v.name} must be a Scalar[int], not {v.type}")
        var = node.attr("var")
        try:
            index = symbol(var) if isinstance(var, str) else None
        except ValueError:
            index = None
        if index is None:
            raise c.error(f"var = {var!r} is not a valid size symbol name")
        if len(node.regions) != 1:
            raise c.error(f"expected one region (the body), got {len(node.regions)}")
        (body,) = node.regions
        types = [v.type for v in init]
        _check_types(c, "body argument", body.args, types)
        _check_types(c, "result", node.outputs, types)

        start, stop, step = (_size_const(c, v) for v in bounds)
        sign = None if step is None else _sign(c.ctx, step)
        if sign == 0:
            raise c.error("the step is zero")
        facts: list[sympy.Basic] = []
        lo: Dim | None = None  # the lowest and highest value the index can take
        hi: Dim | None = None
        if sign == 1:
            lo, hi = start, (None if stop is None else stop - 1)
            facts += [sympy.Ge(index, start)] if start is not None else []
            facts += [sympy.Lt(index, stop)] if stop is not None else []
        elif sign == -1:
            lo, hi = (None if stop is None else stop + 1), start
            facts += [sympy.Le(index, start)] if start is not None else []
            facts += [sympy.Gt(index, stop)] if stop is not None else []
        if index in block_symbols(body):
            # Size symbols are non-negative integers: the index must be one too.
            if lo is None:
                raise c.error(
                    f"the body uses the loop index {index}, so start, stop and step must be constants "
                    "that show the index is never negative"
                )
            try:
                nonnegative = c.ctx.decide(sympy.Ge(lo, 0)) if not isinstance(lo, int) else lo >= 0
            except UndecidableError:
                nonnegative = False
            if not nonnegative:
                raise c.error(f"the loop index {index} may be negative (its lowest value is {lo})")
        c.block(
            body,
            ranges={index: (lo, hi) if lo is not None and hi is not None else None},
            facts=facts,
        )
        _check_types(c, "body yield", body.results, types)


class While(Op):
    """``while(*init)`` with a condition and a body region; see the module docstring."""

    name = "while"
    traits = CONTROL
    num_outputs = None

    @staticmethod
    def infer(ctx: ShapeContext, *inputs: Type) -> tuple[Type, ...]:
        raise _no_rule("while")

    @staticmethod
    def reference(*inputs: Any) -> Any:
        raise _no_reference("while")

    @staticmethod
    def check_regions(node: Node, c: RegionChecker) -> None:
        if len(node.regions) != 2:
            raise c.error(f"expected two regions (condition, body), got {len(node.regions)}")
        cond, body = node.regions
        types = [v.type for v in node.inputs]
        _check_types(c, "condition argument", cond.args, types)
        _check_types(c, "body argument", body.args, types)
        _check_types(c, "result", node.outputs, types)
        c.block(cond)
        c.block(body)
        if len(cond.results) != 1:
            raise c.error(f"the condition yields {len(cond.results)} values, expected one")
        (pred,) = cond.results
        if not _is_predicate(c.ctx, pred.type):
            raise c.error(f"the condition yields {pred.type}, not a Scalar[bool] or a one-element tensor")
        _check_types(c, "body yield", body.results, types)


__all__ = ["For", "If", "While"]
