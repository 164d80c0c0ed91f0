"""Capture of a custom op call: one ``namespace::name`` node whose region is the op's
reference, traced at the call's own (symbolic) input types.

The reference runs as any user function called from compiled code does (converted
when it is user code, so its Python control flow and the globals it reads are
captured and guarded); its torch calls are recorded inside the node's region,
whose arguments stand for the call's tensor operands. The node's results have
the types the region yields. See :mod:`cuvil_ir.graph_ir.ops.composite`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend import hooks
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.nodes import Node, Value
from cuvil_ir.graph_ir.types import TensorType

#: the Python types an attribute of a custom op may have
ATTR_TYPES = (bool, int, float, str)


def capture_rule(
    name: str,
    reference: Callable[..., Any],
    bind: Callable[..., tuple[list[Any], dict[str, Any]]],
    lowerings: Mapping[str, str],
    *,
    captured: bool = True,
    used: Callable[[], None] = lambda: None,
    current: Callable[[], Any] | None = None,
) -> Callable[..., Any]:
    """The capture rule of custom op ``name``: ``bind(*args, **kwargs)`` splits a call
    into its tensor operands and its attributes (the declaration's signature); the
    node also carries each native lowering, as attribute ``lower_<target>``. Not
    ``captured`` (an op declared with a shape function): a node without a region,
    typed by the op's shape rule. ``used()`` is called at each capture; ``current()``
    returns the op's declaration, guarded by identity: a call through
    ``torch.ops.<ns>.<name>`` reads no global that would change when the op is
    declared again, so the guard is what recompiles it then."""

    def rule(b: Tracer, *args: Any, **kwargs: Any) -> Any:
        used()
        if current is not None:
            b.reads.read(f"custom op {name}", name, name.replace("::", "."), current, current())
        try:
            tensors, attrs = bind(*args, **kwargs)
        except TypeError as e:
            raise CompileError(f"{name}: {e}", b.source_loc()) from None
        for k, v in attrs.items():
            if not isinstance(v, ATTR_TYPES):
                raise CompileError(
                    f"{name}: attribute {k!r} is a {type(v).__name__}; attributes are Python "
                    "bool, int, float or str values fixed at compile time",
                    b.source_loc(),
                    "pass tensors as positional operands",
                )
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise CompileError(
                    f"{name}: operand {i} is a {type(t).__name__}, not a tensor", b.source_loc()
                )
        inputs = tuple(b.value_of(t) for t in tensors)
        loc, where = b.loc(), b.source_loc()
        lowered = {f"lower_{t}": text for t, text in lowerings.items()}
        if not captured:
            out = b.emit(name, tensors, **attrs, **lowered)
            results = [b.value_of(h) for h in pytree.tree_leaves(out)]
            if lowerings:
                _check_elementwise(b, name, inputs, results, lowerings, where)
            return out
        fn = hooks._converted(reference)
        with b.region([v.type for v in inputs]) as body:
            with b.mode():  # the handler runs with the tracer's mode popped
                out = fn(*body.args, **attrs)
            leaves, spec = pytree.tree_flatten(out)
            if not leaves or not all(isinstance(x, TensorProxy) for x in leaves):
                raise CompileError(
                    f"{name}: the reference must return a tensor or a tuple of tensors, got {out!r}", where
                )
            body.finish(leaves)
        _check_sizes_bound(name, reference, inputs, body.results, where)
        if lowerings:
            _check_elementwise(b, name, inputs, body.results, lowerings, where)
        outputs = tuple(b._fresh(v.type) for v in body.results)
        all_attrs = {**attrs, **lowered}
        b.nodes.append(Node(name, inputs, outputs, tuple(sorted(all_attrs.items())), (body.block,), loc=loc))
        return pytree.tree_unflatten([b.wrap(v) for v in outputs], spec)

    return rule


def _check_sizes_bound(
    name: str, reference: Callable[..., Any], inputs: Sequence[Value], results: Sequence[Value], where: Any
) -> None:
    """A captured op's result sizes follow from its operands' (its node is typed by its
    region): a size the reference computed from tensor data (``x[x > 0]``, ``nonzero``)
    is refused here, at the declaration, with what to write instead."""
    import sympy

    def symbols(v: Value) -> set[Any]:
        t = v.type
        if not isinstance(t, TensorType):
            return set()
        return set().union(*(sympy.sympify(d).free_symbols for d in t.shape))

    known = set().union(*(symbols(v) for v in inputs))
    for k, r in enumerate(results):
        free = symbols(r) - known
        if not free:
            continue
        code = getattr(reference, "__code__", None)
        loc = SourceLoc(code.co_filename, code.co_firstlineno, 0) if code is not None else where
        shown = tuple(r.type.shape) if isinstance(r.type, TensorType) else r.type
        which = "its result" if len(results) == 1 else f"its result {k}"
        raise CompileError(
            f"custom op {name}: {which} has a data-dependent shape {shown} (called at {where}: "
            f"{', '.join(sorted(map(str, free)))} computed from tensor values, as x[x > 0] or nonzero "
            "do); a custom op's result sizes must follow from its operands' shapes",
            loc,
            "return a result whose shape follows from the operands' (torch.where(x > 0, x, 0) instead "
            "of x[x > 0]) and declare it with shape=, which maps the operands' shapes to the result's, "
            f"e.g. @cu.custom_op({name!r}, shape=lambda x: x) (the reference then runs as a call, its "
            "result checked against shape= at each call)",
        )


def _check_elementwise(
    b: Tracer,
    name: str,
    inputs: Sequence[Value],
    results: Sequence[Value],
    lowerings: Mapping[str, str],
    where: Any,
) -> None:
    """A native lowering is an expression per element: the result is the broadcast of
    the operands (numpy rules), in a float or integer dtype."""
    (out,) = results
    shape = out.type.shape if isinstance(out.type, TensorType) else ()
    for v in inputs:
        t = v.type
        ok = isinstance(t, TensorType) and t.rank <= len(shape)
        if ok and isinstance(t, TensorType):
            tail = shape[len(shape) - t.rank :]
            ok = all(d == 1 or b.ctx.equal(d, o) for d, o in zip(t.shape, tail))
        if not ok:
            raise CompileError(
                f"{name} has native lowerings ({', '.join(lowerings)}), which compute one element from one "
                f"element of each operand, but operand %{v.name} {v.type} does not broadcast to its result {out.type}",
                where,
                "keep native lowerings for elementwise ops; a reduction fuses from its decomposition",
            )


def operands(tensors: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The tensors among a call's operands (what ``handle_torch_function`` inspects)."""
    return tuple(t for t in tensors if isinstance(t, torch.Tensor))


__all__ = ["ATTR_TYPES", "capture_rule", "operands"]
