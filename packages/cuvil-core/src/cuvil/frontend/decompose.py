"""Calls with no Cuvil declaration, captured through torch's Python references.

[Note: decompositions] A torch call the registry does not declare (``torch.lerp``,
``torch.addcmul``, ``torch.trace`` ...) used to become one extern node: an opaque
call into torch, typed by torch's fake kernels, that no target fuses and that
targets without a torch at run time cannot run. Many such calls have a Python
reference in ``torch._refs`` (the implementations torch's own decompositions and
its ``TorchRefsMode`` use), written in terms of other torch calls, most of which
Cuvil declares. :func:`decompose` runs that reference on the call's proxies, with
the tracer's mode on, so each torch call it makes is handled as if the user had
made it -- declared ops become nodes, undeclared ones are decomposed in turn.

The attempt is all or nothing (:func:`attempt`): it is kept only if every
node it recorded is a declared op. It is rolled back -- nodes, constants, lifted
tensors and size facts as before -- and the call becomes the one extern node it
always was when the reference

- records an extern node (a ``prims`` call, or a call with neither a declaration
  nor a reference),
- raises anything (a size check the reference makes that our symbolic sizes do
  not decide, a call form it does not take ...),
- needs a size or value computed from tensor data, or
- returns something other than proxies and Python values.

So a decomposition never makes a call fail that the extern path would compile.
Torch tests each reference against its eager kernel (its ``python_ref_db``), and
the OpInfo sweep (``tests/test_opinfo.py``) compares the compiled result with
eager on both CPU targets. Left out: calls that update an argument in place (the
extern path and the in-place twins handle those) and random or uninitialized
results (their values differ from eager's by design).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cuvil.frontend.checkpoint import Recording
from cuvil.frontend.proxy import TensorProxy
from cuvil_ir.graph_ir.registry import REGISTRY

#: references never used: random or uninitialized values, in-place updates of a view
#: through strides, or references that are slower than the extern kernel they replace
#: by an order of magnitude (a Python loop over elements)
_SKIP = frozenset(
    {
        "as_strided",
        "as_strided_scatter",
        "as_strided_copy",
        "empty_strided",
        "empty_permuted",
        "new_empty_strided",
        "normal",
        "randn",
        "cauchy_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "resize",
        "item",
        "equal",
        "allclose",
        # FFTs and short-time transforms reference prims of the same name
        "stft",
        "istft",
    }
)


@functools.cache
def _references() -> dict[Any, Callable[..., Any]]:
    from torch._prims.context import torch_to_refs_map

    return dict(torch_to_refs_map())


def reference(func: Any) -> Callable[..., Any] | None:
    """The Python reference of torch call ``func``, or None."""
    try:
        ref = _references().get(func)
    except TypeError:  # an unhashable callable
        return None
    if ref is None:
        return None
    name = getattr(func, "__name__", "")
    if name in _SKIP or (name.endswith("_") and not name.startswith("_")) or name.startswith("__i"):
        return None
    if name.startswith("fft_"):
        return None
    return ref


class Decomposer(Recording, Protocol):
    """What a decomposition needs of the tracer (:class:`cuvil.frontend.tracer.Tracer`,
    which imports this module): tentative recording, the calls being decomposed (per
    compile: two threads may trace at once) and the mode a reference runs under."""

    decomposing: list[Any]

    def mode(self) -> TorchFunctionMode: ...


class Undecomposable(Exception):
    """Raised inside an attempt to roll it back: this call is left to the extern path."""


# -- primitives -------------------------------------------------------------------
# [Note: primitives as torch calls] References bottom out in ``torch.ops.prims`` calls
# (and a few ``torch.ops.aten`` ones). Each primitive below is spelled as the torch
# call with the same meaning; where the two differ the spelling says so (``prims.div``
# truncates integers, ``prims.transpose`` is a permutation; a reduction over no
# dimension stays extern, as torch's kernel and meta function disagree on it).
# Primitives with no entry, and aten calls whose torch function Cuvil does not
# declare, stay extern calls, which rolls the attempt back.


def _all_dims(a: Any, dims: Any) -> Any:
    return tuple(range(a.dim())) if dims is None else tuple(dims)


def _reduction(reduce: Callable[..., Any]) -> Callable[..., Any]:
    def prim(a: Any, dims: Any, *rest: Any, output_dtype: Any = None) -> Any:
        dims = _all_dims(a, dims)
        if not dims:
            # torch's kernel reduces every dimension, its meta function none: extern
            raise Undecomposable("a primitive reduction over no dimension")
        out = reduce(a, dims, *rest)
        return out if output_dtype is None else out.to(output_dtype)

    return prim


def _prod(a: Any, dims: tuple[int, ...]) -> Any:
    for d in sorted((d % a.dim() for d in dims), reverse=True):
        a = torch.prod(a, d)
    return a


def _var(a: Any, dims: tuple[int, ...], correction: Any = 1) -> Any:
    return torch.var(a, dims, correction=correction)


def _div(a: Any, b: Any) -> Any:
    floating = any(
        (x.dtype.is_floating_point or x.dtype.is_complex)
        if isinstance(x, torch.Tensor)
        else isinstance(x, float)
        for x in (a, b)
    )
    return torch.div(a, b) if floating else torch.div(a, b, rounding_mode="trunc")


def _broadcast_in_dim(a: Any, shape: Any, broadcast_dimensions: Any) -> Any:
    kept = set(broadcast_dimensions)
    for d in range(len(shape)):
        if d not in kept:
            a = a.unsqueeze(d)
    return a.expand(shape)


def _fresh_alias(a: Any, *_: Any, **__: Any) -> Any:
    """A copy (``clone``, ``copy_strided``): values are immutable in Graph IR, so a new
    proxy over the same value is one; an in-place update of either rebinds only it."""
    tracer = a._cuvil_tracer
    return TensorProxy(tracer, tracer.value_of(a))


@functools.cache
def _primitives() -> tuple[dict[Any, Callable[..., Any]], dict[Any, Callable[..., Any]]]:
    """(primitive -> its spelling, same-name primitive -> ``torch.<name>``), built at the
    first undeclared call rather than at import (``import cuvil`` stays cheap)."""
    p = torch.ops.prims
    spelled: dict[Any, Callable[..., Any]] = {
        p.convert_element_type.default: lambda a, dtype: a.to(dtype),
        p.broadcast_in_dim.default: _broadcast_in_dim,
        p.clone.default: _fresh_alias,
        p.copy_strided.default: _fresh_alias,
        p.view_of.default: lambda a: a.view(a.shape),
        p.transpose.default: lambda a, permutation: a.permute(tuple(permutation)),
        p.squeeze.default: lambda a, dimensions: (
            a.squeeze(tuple(dimensions)) if dimensions else a.view(a.shape)
        ),
        p.reshape.default: lambda a, shape: a.reshape(tuple(shape)),
        p.collapse_view.default: _collapse,
        p.collapse.default: _collapse,
        p.split_dim.default: lambda a, dim, outer: a.unflatten(dim, (outer, a.shape[dim] // outer)),
        p.rev.default: lambda a, dims: torch.flip(a, tuple(dims)),
        p.cat.default: lambda tensors, dim: torch.cat(list(tensors), dim),
        p.where.default: torch.where,
        p.fill.default: lambda a, value: torch.full_like(a, value),
        p.div.default: _div,
        p.sum.default: _reduction(torch.sum),
        p.amax.default: _reduction(torch.amax),
        p.amin.default: _reduction(torch.amin),
        p.prod.default: _reduction(_prod),
        p.var.default: _reduction(_var),
        # exact: |NaN| < inf and |inf| < inf are false; 2**a is exp2(a) (torch's pow calls exp2)
        p.isfinite.default: lambda a: torch.abs(a) < math.inf,
        p.exp2.default: lambda a: torch.pow(2.0, a),
    }
    same_name = {getattr(p, name).default: getattr(torch, name) for name in _SAME_NAMES.split()}
    return spelled, same_name


def _collapse(a: Any, start: int, end: int) -> Any:
    return a.flatten(start, end - 1) if end - start > 1 else a.view(a.shape)


#: primitives that are the torch call of the same name on operands the reference has
#: already promoted and broadcast; used only where Cuvil declares that call (else
#: ``torch.<name>`` would decompose back into the primitive)
_SAME_NAMES = (
    "abs acos acosh asin asinh atan atanh ceil cos cosh digamma erf erfc exp expm1 floor "
    "lgamma log log10 log1p log2 neg reciprocal round rsqrt sign signbit sin sinh sqrt tan tanh "
    "trunc bitwise_not add sub mul atan2 bitwise_and bitwise_or bitwise_xor eq ne ge gt "
    "le lt maximum minimum pow fmod remainder fmax fmin hypot nextafter gcd igamma igammac"
)


def _aten_as_torch(func: Any) -> Callable[..., Any] | None:
    """``torch.ops.aten.<name>[.<overload>]`` as ``torch.<name>`` (or the method) when
    Cuvil declares that: torch's Python binding takes the same overloads."""
    if isinstance(func, torch._ops.OpOverload):
        packet, overload = func._overloadpacket, func._overloadname
    elif isinstance(func, torch._ops.OpOverloadPacket):
        packet, overload = func, "default"
    else:
        return None
    qualified = packet._qualified_op_name
    if not qualified.startswith("aten::") or overload.startswith("out") or "out" in overload.split("_"):
        return None
    name = qualified[len("aten::") :]
    if name.endswith("_"):
        return None
    for candidate in (getattr(torch, name, None), getattr(torch.Tensor, name, None)):
        if candidate is not None and REGISTRY.for_torch(candidate) is not None:
            return candidate  # type: ignore[no-any-return]
    return None


def implementation(func: Any) -> Callable[..., Any] | None:
    """What to run in place of undeclared call ``func``: its reference, the torch spelling of
    a primitive or aten call, or None."""
    spelled, same_name = _primitives()
    try:
        prim = spelled.get(func) or same_name.get(func)
    except TypeError:
        return None
    if prim is not None and func in same_name and REGISTRY.for_torch(prim) is None:
        return None
    return prim or reference(func) or _aten_as_torch(func)


def layout(tracer: Decomposer, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Inside a reference, ``x.stride()`` answers the contiguous strides of ``x``'s sizes:
    references ask only to give their result eager's layout (``copy_strided`` when it
    differs), and Graph IR values have no layout. User code asking gets the answer of
    :mod:`cuvil.frontend.metadata`; this one is never seen outside a reference."""
    if (
        not tracer.decomposing
        or func is not torch.Tensor.stride
        or not args
        or not isinstance(args[0], TensorProxy)
    ):
        return NotImplemented
    shape = args[0].shape
    strides: list[Any] = []
    step: Any = 1
    for d in reversed(shape):
        strides.append(step)
        step = step * d
    strides.reverse()
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return tuple(strides) if dim is None else strides[dim]


class Attempt:
    """What :func:`attempt` yields: call :meth:`keep` to keep the recording."""

    kept = False

    def keep(self) -> None:
        self.kept = True


@contextlib.contextmanager
def attempt(tracer: Recording) -> Iterator[Attempt]:
    """Record on ``tracer`` tentatively: unless :meth:`Attempt.keep` is called inside the
    block and what it recorded is declared ops only, everything recorded is rolled back
    and an exception raised inside (``Exception``, not interrupts) is swallowed; see
    [Note: decompositions]. What a rollback restores, and what it leaves (size facts
    learnt stay learnt), is the tracer's ([Note: tracer checkpoints])."""
    before = tracer.checkpoint()
    recording = Attempt()
    try:
        yield recording
    except Exception:
        recording.kept = False
    if recording.kept:
        declared = all(n.op != "extern" for n in tracer.recorded_since(before))
        recording.kept = declared and tracer.seen_data_sizes == before.seen_data_sizes
    if not recording.kept:
        tracer.rollback(before)


def decompose(tracer: Decomposer, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` recorded as the declared ops its reference calls, or
    ``NotImplemented`` (and nothing recorded) when it cannot be; see [Note: decompositions]."""
    impl = implementation(func)
    # the calls this compile is decomposing: a reference that calls itself again (through
    # a primitive spelled as the call) gets the extern path there
    if impl is None or func in tracer.decomposing:
        return NotImplemented
    operands = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, TensorProxy)]
    values = [x._cuvil_value for x in operands]
    kept = False
    tracer.decomposing.append(func)
    try:
        with attempt(tracer) as recording:
            with tracer.mode():  # the handler runs with the tracer's mode popped
                out = impl(*args, **kwargs)
            leaves = pytree.tree_leaves(out)
            # a reference that updated an operand in place is not what eager does
            unchanged = all(x._cuvil_value is v for x, v in zip(operands, values))
            if unchanged and all(isinstance(x, (TensorProxy, bool, int, float, torch.dtype)) for x in leaves):
                recording.keep()
        kept = recording.kept
    finally:
        tracer.decomposing.pop()
        if not kept:
            for x, v in zip(operands, values):
                x._cuvil_value = v
    return _as_eager_returns(func, out) if kept else NotImplemented


def _as_eager_returns(func: Any, out: Any) -> Any:
    """References return lists, plain tuples and their own named tuples where torch
    returns a tuple or a named result (``torch.return_types.aminmax``): the caller sees
    eager's container."""
    if not isinstance(out, (list, tuple)):
        return out
    named = getattr(torch.return_types, getattr(func, "__name__", ""), None)
    if isinstance(named, type) and issubclass(named, tuple):
        return named(tuple(out))
    return tuple(out)


__all__ = ["decompose", "reference"]
