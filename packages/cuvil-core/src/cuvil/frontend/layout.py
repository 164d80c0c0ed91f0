"""``x.is_contiguous()`` on traced tensors: eager's answer, from torch's own strides.

Graph IR values have no layout (the compiled code picks its own), but user code that
asks ``if x.t().is_contiguous():`` takes the branch eager takes only if the answer is
eager's. So the answer is computed the way eager computes it: every torch call the
traced code makes is remembered on the proxies it returns (:func:`record`), and a query
replays the calls that made the value on fake tensors of the mirror's symbolic sizes
(torch's own stride rules: views, and elementwise results that keep a permuted input's
layout). See [Note: layout queries].

[Note: layout queries]
- *What is replayed.* The calls user code made (the capture's torch-function mode sees
  only those; what a capture rule or reference calls inside is not eager's layout), each
  on the fakes of its tensor arguments. ``x.contiguous()`` returns a new proxy of the
  same value, so the original keeps its own layout; the two are aliases for in-place
  updates (refused: which of them an update would reach depends on the layout).
- *Arguments.* An argument's fake has the example's layout: contiguous, or a
  permutation of a contiguous tensor (``x.t()`` passed in). An answer that used it adds
  a *layout guard* (:class:`cuvil.guards.AssumptionCheck` ``layouts``): a later call whose
  argument is laid out otherwise recompiles instead of reusing the answer. Other
  layouts (a strided slice, an expand passed in) are refused.
- *Sizes.* The fakes have symbolic sizes, so where contiguity depends on a size (a
  size-1 dim) torch guards on it and the guard becomes a graph assumption (a recompile
  when it changes), or, on a size computed from tensor data, a located error.
- *What has no answer.* A value out of a captured ``if``/loop, a loop-carried number, a
  parameter, global or other tensor that is not an argument (its layout is not guarded):
  a located :class:`CompileError` saying to call ``.contiguous()`` first (whose result
  is contiguous in every case) or to ask outside the compiled function.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cuvil.errors import CompileError
from cuvil.frontend import data_sizes
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer_view import LayoutGuard, TracerView

HINT = (
    "call .contiguous() first (its result is contiguous, whatever the input), or ask "
    "outside the compiled function"
)


class _Unknown(Exception):
    """Why eager's layout of a value cannot be told at capture."""


class _Mode(TorchFunctionMode):
    """The tracer's torch-function mode, remembering which call made each result."""

    def __init__(self, tracer: TracerView) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = self.tracer.handle(func, args, kwargs)
        record(func, args, kwargs, out)
        return out


def mode(tracer: TracerView) -> TorchFunctionMode:
    """The mode user code is traced under (``tracer.mode()`` plus :func:`record`)."""
    return _Mode(tracer)


def record(func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """Remember on each new proxy ``out`` holds the call that made it (a proxy that was
    an argument of the call is the call's identity or in-place result: same layout)."""
    if not isinstance(out, (TensorProxy, tuple, list)):
        return
    leaves = [out] if isinstance(out, TensorProxy) else pytree.tree_leaves(out)
    made = None
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, TensorProxy) and leaf._cuvil_made is None:
            if made is None:
                # the containers copied: user code may change a list it passed later
                args, kwargs = pytree.tree_map(lambda x: x, (args, kwargs))
                given = {id(x) for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, TensorProxy)}
                made = (func, args, kwargs)
            if id(leaf) not in given:
                leaf._cuvil_made = (*made, i)


def note_argument(proxy: TensorProxy, leaf: int, name: str, example: torch.Tensor) -> None:
    """``proxy`` is argument leaf ``leaf`` of the call, traced with ``example``."""
    proxy._cuvil_argument = (leaf, name, tuple(example.shape), tuple(example.stride()))


def contiguous(tracer: TracerView, p: TensorProxy, memory_format: Any = None) -> TensorProxy:
    """``x.contiguous()``: the same value, as a new proxy (eager returns ``x`` itself or
    a contiguous copy; the new proxy is contiguous in either case, while ``x`` keeps its
    layout). An alias of ``x`` for in-place updates (see [Note: layout queries])."""
    if tracer.decomposing:
        return p  # inside a reference: Graph IR values have no layout (cuvil/frontend/decompose.py)
    out = type(p)(tracer, p._cuvil_value)
    out._cuvil_is_input = p._cuvil_is_input
    base = p if p._cuvil_base is None else p._cuvil_base
    base._cuvil_has_views = True
    out._cuvil_base = base
    return out


def is_contiguous(tracer: TracerView, p: TensorProxy, memory_format: Any = torch.contiguous_format) -> bool:
    """Eager's ``p.is_contiguous(memory_format)``; see [Note: layout queries]."""
    if tracer.decomposing:
        # inside a reference run by cuvil/frontend/decompose.py: Graph IR values are contiguous
        # there, as its `x.stride()` answers
        return True
    if p.ir_type.rank == 0 and memory_format in (torch.contiguous_format, torch.preserve_format):
        return True  # a 0-d tensor (a carried number too) always is
    loc = tracer.source_loc()
    try:
        fake, args = _fake(tracer, p)
    except _Unknown as e:
        raise CompileError(
            f"cannot tell whether this tensor is contiguous as eager would: {e}", loc, HINT
        ) from None
    with data_sizes.guards(tracer, loc):
        answer = bool(fake.is_contiguous(memory_format=memory_format))
    # the sizes the answer (and the replay) depended on become assumptions, located here
    tracer.sync(f"{loc}: is_contiguous()" if loc else "is_contiguous()")
    tracer.layout_guards.update(args)
    return answer


def guards(tracer: TracerView) -> tuple[LayoutGuard, ...]:
    """The layout guards answers needed: (argument leaf, dim order, name), by leaf."""
    found = tracer.layout_guards
    return tuple(found[k] for k in sorted(found))


def _fake(tracer: TracerView, p: TensorProxy) -> tuple[Any, dict[int, LayoutGuard]]:
    """A fake tensor with eager's layout for ``p``, and the argument layouts it used."""
    if p._cuvil_fake is not None:
        return p._cuvil_fake
    if p._cuvil_argument is not None:
        out = _argument_fake(tracer, p, p._cuvil_argument)
    elif p._cuvil_made is not None:
        out = _replay(tracer, *p._cuvil_made)
    elif p._cuvil_is_input:
        raise _Unknown(
            f"%{p._cuvil_value.name} is a parameter, buffer or global tensor, whose layout the "
            "compiled function does not guard"
        )
    else:
        raise _Unknown(
            f"%{p._cuvil_value.name} was not made by a torch call of the traced code (it comes "
            "out of a captured `if` or loop, or is a carried Python number)"
        )
    p._cuvil_fake = out
    return out


def _argument_fake(
    tracer: TracerView, p: TensorProxy, argument: tuple[int, str, tuple[int, ...], tuple[int, ...]]
) -> tuple[Any, dict[int, LayoutGuard]]:
    leaf, name, shape, stride = argument
    # the dim order, outermost first (a contiguous example: the identity, whatever the
    # strides of its size-1 dims)
    example = torch.empty_strided(shape, stride, device="meta")
    order = tuple(range(len(shape)))
    if not example.is_contiguous():
        order = tuple(sorted(order, key=lambda d: (-stride[d], d)))
    if not example.permute(order).is_contiguous():
        raise _Unknown(
            f"the argument {name} is neither contiguous nor a permutation of a contiguous tensor "
            f"(strides {list(stride)}: a strided slice or an expand)"
        )
    sizes = [tracer.size(d) for d in p.ir_type.shape]
    strides: list[Any] = [0] * len(sizes)
    step: Any = 1
    for d in reversed(order):
        strides[d] = step
        step = step * sizes[d]
    m = tracer.mirror
    with m.mode:
        fake = torch.empty_strided(sizes, strides, dtype=p.ir_type.dtype.torch, device=p.ir_type.device)
    return fake, {leaf: (leaf, order, name)}


def _replay(
    tracer: TracerView, func: Any, args: Any, kwargs: Any, index: int
) -> tuple[Any, dict[int, LayoutGuard]]:
    from torch._dispatch.python import enable_python_dispatcher

    used: dict[int, LayoutGuard] = {}

    def fake_of(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            f, u = _fake(tracer, x)
            used.update(u)
            return f
        if isinstance(x, torch.Tensor):
            raise _Unknown("a tensor that is not an argument takes part (its layout is not guarded)")
        return x

    fargs, fkwargs = pytree.tree_map(fake_of, (args, kwargs))
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    m = tracer.mirror
    try:
        with enable_python_dispatcher(), m.mode:
            out = func(*fargs, **fkwargs)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise _Unknown(
            f"torch cannot compute the layout of `{name}` here ({type(e).__name__}: {first})"
        ) from None
    leaves = pytree.tree_leaves(out)
    if index >= len(leaves) or not isinstance(leaves[index], torch.Tensor):
        raise _Unknown(f"`{name}` returned no tensor where the traced call did")
    return leaves[index], used


__all__ = ["contiguous", "guards", "is_contiguous", "mode", "note_argument", "record"]
