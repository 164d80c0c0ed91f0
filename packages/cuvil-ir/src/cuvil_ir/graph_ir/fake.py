"""Output types of arbitrary torch calls, from torch's own fake/meta kernels.

This is how ``extern`` nodes get symbolic output types: our size symbols are
mirrored into a torch ``ShapeEnv`` (no duck sizing, no 0/1 specialisation),
fake tensors with those symbolic sizes are built, the torch callable runs under
``FakeTensorMode``, and the symbolic sizes of the results are mapped back. Any
size fact torch had to assume (its guards) becomes an assumption of our graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Ref
from cuvil_ir.graph_ir.types import DType, ScalarKind, TensorType, Type
from cuvil_ir.symbolic import Dim, ShapeContext, UndecidableError, as_dim, free_symbols


class FakeInferenceError(Exception):
    """torch could not compute the output type symbolically."""


def _source_class() -> type:
    from torch._guards import GuardSource, Source

    @dataclasses.dataclass(frozen=True)
    class SymbolSource(Source):  # type: ignore[misc]
        label: str = ""

        @property
        def _name_template(self) -> str:
            return self.label

        @property
        def guard_source(self) -> GuardSource:
            return GuardSource.LOCAL

    return SymbolSource


_SOURCE: type | None = None


def materialize(value: AttrValue, refs: Sequence[Any]) -> Any:
    """Turn an attribute tree with :class:`Ref` placeholders into call arguments."""
    if isinstance(value, Ref):
        return refs[value.index]
    if isinstance(value, KV):
        return {k: materialize(v, refs) for k, v in value.items}
    if isinstance(value, tuple):
        return tuple(materialize(v, refs) for v in value)
    if isinstance(value, DType):
        return value.torch
    return value


def fake_call(
    ctx: ShapeContext,
    fn: Callable[..., Any],
    inputs: Sequence[Type],
    args: AttrValue,
    kwargs: AttrValue,
    what: str,
) -> list[Type]:
    """Types of the flattened outputs of ``fn(*args, **kwargs)`` on inputs of ``inputs`` types."""
    global _SOURCE
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils import _pytree as pytree

    if ctx.hints is None:
        raise UndecidableError(f"{what}: extern types need example sizes")
    if _SOURCE is None:
        _SOURCE = _source_class()
    shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False, assume_static_by_default=False)
    ours_to_theirs: dict[sympy.Symbol, sympy.Expr] = {}
    syms = sorted(
        free_symbols(d for t in inputs if isinstance(t, TensorType) for d in t.shape), key=lambda s: s.name
    )
    for s in syms:
        theirs = shape_env.create_symbol(
            ctx.hint(s), _SOURCE(label=s.name), dynamic_dim=DimDynamic.DYNAMIC, positive=None,
            do_not_specialize_zero_one=True,
        )
        ours_to_theirs[s] = theirs
    theirs_to_ours = {v: k for k, v in ours_to_theirs.items() if isinstance(v, sympy.Symbol)}

    def symint(d: Dim) -> Any:
        if isinstance(d, int):
            return d
        return shape_env.create_symintnode(d.xreplace(ours_to_theirs), hint=ctx.hint(d))

    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=False)
    refs: list[Any] = []
    with mode:
        for t in inputs:
            if isinstance(t, TensorType):
                sizes = [symint(d) for d in t.shape]
                strides, acc = [], 1
                for s in reversed(sizes):
                    strides.append(acc)
                    acc = acc * s
                refs.append(torch.empty_strided(sizes, list(reversed(strides)), dtype=t.dtype.torch, device=t.device))
            else:
                refs.append({ScalarKind.bool: True, ScalarKind.int: 1, ScalarKind.float: 1.0}[t.kind])
        call_args = materialize(args, refs)
        call_kwargs = materialize(kwargs, refs)
        try:
            out = fn(*call_args, **call_kwargs)
        except Exception as e:
            raise FakeInferenceError(f"{what}: torch could not compute the output type: {type(e).__name__}: {e}") from e

    def back(d: Any) -> Dim:
        if isinstance(d, torch.SymInt):
            expr = d.node.expr.xreplace(theirs_to_ours)
            stray = {s for s in expr.free_symbols if s not in ours_to_theirs}
            if stray:
                raise FakeInferenceError(f"{what}: the output size depends on tensor data ({d.node.expr})")
            return as_dim(expr)
        return int(d)

    types: list[Type] = []
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor):
            types.append(TensorType(DType.from_torch(leaf.dtype), tuple(back(d) for d in leaf.shape), str(leaf.device)))
        else:
            raise FakeInferenceError(
                f"{what} returns a Python {type(leaf).__name__} computed from tensor data; "
                "data-dependent values are not supported yet"
            )
    for guard in shape_env.guards:
        fact = guard.expr.xreplace(theirs_to_ours)
        if fact.free_symbols - set(ours_to_theirs):
            continue
        if fact not in ctx.assumptions and fact != sympy.true:
            ctx.assumptions.append(fact)
            ctx.reasons.setdefault(fact, f"assumed by torch's implementation of {what}")
    return types


__all__ = ["FakeInferenceError", "fake_call", "materialize"]
