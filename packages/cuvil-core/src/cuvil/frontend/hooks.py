"""Runtime helpers called by converted code (see :mod:`cuvil.frontend.convert`).

Converted statements call ``if_``/``while_``/``for_``, which run Python for a
Python condition and record a structured op for a size or tensor condition (see
:mod:`cuvil.frontend.regions`). Constructs that stay Python call ``truth``/
``boolop`` where Python asks a value for its truth and ``iterate`` where it loops
over one: Python values behave exactly as in Python, size predicates are decided
from the example inputs and guarded, and tensor values are rejected with the
construct's source location. ``call`` converts user callees on the fly.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from cuvil import autocast
from cuvil.errors import CompileError
from cuvil.frontend import attribute_reads, data_sizes, impure
from cuvil.frontend.convert import SITES, ConversionError, convert, is_user_function
from cuvil.frontend.numbers import number
from cuvil.frontend.object_state import has_hooks
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.reads import MUTATORS
from cuvil.frontend.regions import (
    UNROLL_LIMIT,
    SymRange,
    Undefined,
    capture_for,
    capture_if,
    capture_while,
    static_truth,
)
from cuvil.frontend.tracer import Tracer
from cuvil.guards import MISSING
from cuvil_ir.graph_ir.types import DType

#: The class of ``cu.compile``'s results (:class:`cuvil.api.CompiledFunction`), set by
#: :mod:`cuvil.api` (which imports this module, through capture): one called from compiled
#: code is inlined, its original function traced instead.
COMPILED_FUNCTION: tuple[type[Any], ...] = ()

_HINTS = {
    "if": "an `if` inside a loop body that uses `break`/`continue`/`return` stays Python; "
    "restructure the loop, or select with torch.where(cond, a, b)",
    "while": "remove `break`/`continue`/`return` from the loop body so it can be captured as one loop",
    "for": "iterate over range(x.shape[0]) and index, or use tensor ops over the whole axis",
    "assert": "assert on sizes (x.shape) instead; tensor values are only known at run time",
}


def _reject(kind: str, site: int, what: str) -> CompileError:
    return CompileError(
        f"`{kind}` on {what}: this construct needs a Python value, but the value is only known "
        "when the compiled code runs",
        SITES[site].loc,
        _HINTS.get(kind, "use tensor ops (torch.where, torch.logical_and ...) instead of Python truth tests"),
    )


def _outer(value: Any) -> Any:
    """A tensor read from outside the call as its graph input (``Tracer.outer``): its
    truth or value is then what it is for an argument tensor, not frozen at capture."""
    tracer = _tracer()
    return value if tracer is None else tracer.outer(value)


def truth(value: Any, site: int) -> bool:
    value = _outer(value)
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor value")
    tracer = _tracer()
    if isinstance(value, torch.SymBool) and tracer is not None:
        tracer.sync()
        result = bool(value)
        where = SITES[site]
        tracer.sync(f"{where.loc}: `{where.kind}` on a size")
        return result
    return bool(value)


def boolop(value: Any, site: int) -> Any:
    """An operand of ``and``/``or``: Python tests its truth but yields the value itself."""
    value = _outer(value)
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor value")
    return value


def not_(value: Any, site: int) -> Any:
    """``not value``: Python's for a Python value or a size predicate; for a one-element
    tensor (a carried number, ``x.sum() > 0``) a bool number known when the code runs."""
    value = _outer(value)
    if isinstance(value, TensorProxy):
        return number(torch.logical_not(_truth_tensor(value, site)))
    return not truth(value, site)


def and_(site: int, first: Any, *rest: Any) -> Any:
    """``first and rest[0]() and ...`` (the later operands are thunks)."""
    return _boolop(site, first, rest, is_and=True)


def or_(site: int, first: Any, *rest: Any) -> Any:
    """``first or rest[0]() or ...`` (the later operands are thunks)."""
    return _boolop(site, first, rest, is_and=False)


def _boolop(site: int, value: Any, thunks: tuple[Any, ...], *, is_and: bool) -> Any:
    """Python's short circuit while the operands are Python values or size predicates
    (decided and guarded as ``truth`` does). Once an operand that is not the last is a
    tensor, the rest are evaluated too and the result is a bool number: an ``and``/``or``
    of bools is the bool Python's operator returns. A non-bool operand is then refused
    (Python would return one of the operands, which one is only known at run time)."""
    i = 0
    value = _outer(value)
    while not isinstance(value, TensorProxy) or i == len(thunks):
        if i == len(thunks) or truth(value, site) != is_and:
            return value  # the last operand, or `a and b` with a falsy `a` (`a or b`: truthy)
        value = _outer(thunks[i]())
        i += 1
    acc = _bool_operand(value, site)
    for thunk in thunks[i:]:
        nxt = _outer(thunk())
        if isinstance(nxt, TensorProxy):
            acc = (torch.logical_and if is_and else torch.logical_or)(acc, _bool_operand(nxt, site))
        elif isinstance(nxt, (bool, torch.SymBool)):
            if truth(nxt, site) != is_and:
                return nxt  # `acc and False` is False, `acc or True` is True, whatever acc is
        else:
            raise _reject(SITES[site].kind, site, "a tensor value beside an operand that is not a bool")
    return number(acc)


def _one_element(value: TensorProxy, site: int) -> TensorProxy:
    """``value`` as a 0-d tensor: Python's truth of a tensor needs exactly one element."""
    shape = value.ir_type.shape
    if any(d != 1 for d in shape):
        raise _reject(SITES[site].kind, site, "a tensor that may have more than one element")
    return value.reshape(()) if shape else value


def _bool_operand(value: TensorProxy, site: int) -> TensorProxy:
    if value.ir_type.dtype != DType.bool:
        raise _reject(SITES[site].kind, site, f"a {value.ir_type.dtype.value} tensor value (not a bool)")
    return _one_element(value, site)


def _truth_tensor(value: TensorProxy, site: int) -> TensorProxy:
    """Python's truth of a one-element tensor, as a 0-d bool tensor."""
    one = _one_element(value, site)
    return one if one.ir_type.dtype == DType.bool else torch.ne(one, 0)


def iterate(value: Any, site: int) -> Any:
    value = _outer(value)
    if isinstance(value, TensorProxy):
        raise _reject(SITES[site].kind, site, "a tensor (iterating over its rows)")
    return value


#: how deep one user function may call itself while it is captured (recursion on a
#: Python value is unrolled; deeper recursion is almost always missing a base case)
RECURSION_LIMIT = 32


def call(site: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``, converting it first when it is user code (recursively)."""
    if fn is range and any(isinstance(a, torch.SymInt) for a in args):
        return SymRange(*args)
    tracer = _tracer()
    if tracer is not None:
        if fn is builtins.print:
            return _print(tracer, site, args, kwargs)
        if fn is os.getenv and args:
            return impure.getenv(tracer.reads, *args, **kwargs)
        query = impure.query(fn)
        if query is not None:  # torch.is_grad_enabled() ...: guarded by its result
            return impure.guarded_query(tracer.reads, query, fn, args, kwargs)
        why = impure.refusal(fn)
        if why is not None:
            name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
            raise CompileError(
                f"`{name}` {why[0]}: inside compiled code it would run once, while it is captured, "
                "and every later call would reuse that result where eager gets a new one",
                SITES[site].loc,
                why[1],
            )
        if fn in (builtins.setattr, builtins.delattr) and args:
            tracer.reads.store(args[0], "attribute", SITES[site].loc)
        if fn in (builtins.getattr, builtins.hasattr) and len(args) in (2, 3) and not kwargs:
            return _attribute_query(tracer, fn, *args)
        if fn in (builtins.vars, builtins.dir) and len(args) == 1 and not kwargs:
            namespace = attr(args[0], "__dict__")  # read whole, guarded by its contents
            return namespace if fn is builtins.vars else dir(args[0])
        if fn in (builtins.int, builtins.min, builtins.max):
            if fn is builtins.int and args:  # int(T) of a global tensor: as of an argument
                args = (tracer.outer(args[0]), *args[1:])
            result = data_sizes.builtin(tracer, fn, args, kwargs)  # a size computed from data
            if result is not NotImplemented:
                return result
    target = _converted(_unwrap(fn))
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is not None and "__cuvil_wrapped__" in getattr(target, "__dict__", {}):
        code = None  # a builtin wrapped while captures run (cuvil/frontend/builtin_args.py)
    if tracer is None:
        return target(*args, **kwargs)
    if code is None:
        with data_sizes.guards(tracer, SITES[site].loc):  # float(n) of a size computed from data
            result = target(*args, **kwargs)
        autocast.check_entered(tracer, fn, args, result, SITES[site].loc)
        return result
    tracer.reads.add_file(code)
    depth = tracer.depth.get(code, 0)
    if depth >= RECURSION_LIMIT:
        raise CompileError(
            f"`{getattr(fn, '__qualname__', fn)}` calls itself more than {RECURSION_LIMIT} times "
            "deep while it is captured",
            SITES[site].loc,
            "recursion is unrolled at compile time, so it must end by a Python value (an int "
            "argument counting down) within that depth; use a loop over a tensor condition otherwise",
        )
    tracer.depth[code] = depth + 1
    try:
        return target(*args, **kwargs)
    finally:
        tracer.depth[code] = depth


def _unwrap(fn: Any) -> Any:
    """A ``cu.compile`` result called from compiled code is inlined: its original function."""
    if isinstance(fn, COMPILED_FUNCTION):
        return fn.fn
    if isinstance(fn, functools.partial) and isinstance(fn.func, COMPILED_FUNCTION):  # a bound method
        return functools.partial(fn.func.fn, *fn.args, **fn.keywords)
    return fn


# -- reads of globals, closure variables and attributes (see scopes.py, reads.py) --


def glob(name: str, value: Any) -> Any:
    tracer = _tracer()
    if tracer is not None:
        if value is os.environ:  # each variable read is guarded instead (impure.EnvironReads)
            return impure.EnvironReads(tracer.reads)
        tracer.reads.glob(sys._getframe(1).f_globals, name, value)
    return value


def free(cells: dict[str, types.CellType], name: str) -> Any:
    cell = cells[name]
    try:
        value = cell.cell_contents
    except ValueError:
        raise NameError(
            f"cannot access free variable '{name}' where it is not associated with a value in enclosing scope"
        ) from None
    tracer = _tracer()
    if tracer is not None:
        if value is os.environ:
            return impure.EnvironReads(tracer.reads)
        tracer.reads.free(cell, name, value)
    return value


def attr(obj: Any, name: str) -> Any:
    value = getattr(obj, name)
    tracer = _tracer()
    if tracer is not None and not isinstance(obj, TensorProxy):
        if value is os.environ:
            return impure.EnvironReads(tracer.reads)
        tracer.reads.attr(obj, name, value, tracer.source_loc() if name in MUTATORS else None)
    return value


#: what ``call`` runs as it is runs for the traced code: its reads of recorded modules count
attribute_reads.USER_CALLS.add(call.__code__)


def _attribute_query(tracer: Any, fn: Any, obj: Any, name: Any, *default: Any) -> Any:
    """``getattr(obj, name[, default])`` and ``hasattr(obj, name)`` in converted code: a read
    of ``obj.name`` as ``obj.name`` is (guarded by its value), and when it is missing, a
    guard that it stays missing (setting it later recompiles: the default was taken)."""
    if not isinstance(name, str) or isinstance(obj, TensorProxy) or (fn is builtins.hasattr and default):
        return fn(obj, name, *default)
    try:
        value = attr(obj, name)
    except AttributeError:
        tracer.reads.attr(obj, name, MISSING, None)
        if fn is builtins.hasattr:
            return False
        if default:
            return default[0]
        raise
    return True if fn is builtins.hasattr else value


def store(obj: Any, site: int) -> None:
    tracer = _tracer()
    if tracer is not None:
        tracer.reads.store(obj, SITES[site].kind, SITES[site].loc)


# -- print and f-strings: example values, at capture ---------------------------------


def shown(value: Any) -> Any:
    """What an f-string shows for a value: a size prints its example value (no guard)."""
    tracer = _tracer()
    if tracer is None or not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value
    try:
        example = tracer.ctx.hint(tracer.sym(value))
    except Exception:  # a loop index has no example value: show the symbol
        return value
    return _PLAIN[type(value)](example)


_PLAIN: dict[type, type] = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _print(tracer: Any, site: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    loc = SITES[site].loc
    warnings.warn_explicit(
        "print() in compiled code runs once, while the function is captured, with the example "
        "inputs' sizes (tensors print as their traced type); it does not run on later calls",
        UserWarning,
        loc.file,
        loc.line,
    )
    builtins.print(*(shown(a) for a in args), **kwargs)
    # a side effect of capturing: a variant that prints is captured (and prints) in each
    # process, never served from the cache of captured variants
    tracer.reads.storable = False


# -- structured control flow (statements rewritten by control_flow.py) -------------


def load(scope: dict[str, Any], name: str, site: int) -> Any:
    """The current value of a variable, or an :class:`Undefined` marker."""
    if name in scope:
        return scope[name]
    return Undefined(name, SITES[site].loc)


def _tracer() -> Any:
    return Tracer.current()


def if_(cond: Any, then_fn: Any, else_fn: Any, site: int, values: tuple[Any, ...]) -> Any:
    """A converted ``if``: Python when the condition is a Python value, else one ``if`` op."""
    tracer = _tracer()
    cond = _outer(cond)
    if tracer is not None and isinstance(cond, (TensorProxy, torch.SymBool)):
        if isinstance(cond, torch.SymBool):
            tracer.sync()
            decided = static_truth(tracer, cond)
            if decided is not None:
                return (then_fn if decided else else_fn)(*values)
        return capture_if(tracer, cond, then_fn, else_fn, values, SITES[site].loc)
    if isinstance(cond, TensorProxy):
        raise _reject("if", site, "a tensor value")
    return (then_fn if cond else else_fn)(*values)


def while_(cond_fn: Any, body_fn: Any, site: int, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A converted ``while``: a Python loop, or one ``while`` op when the condition is a tensor."""
    tracer = _tracer()
    cond = _outer(cond_fn(*values))
    if tracer is not None and isinstance(cond, (TensorProxy, torch.SymBool)):
        if isinstance(cond, torch.SymBool) and static_truth(tracer, cond) is False:
            return values
        return capture_while(tracer, cond_fn, body_fn, values, names, SITES[site].loc)
    while truth(cond, site):
        values = body_fn(*values)
        cond = _outer(cond_fn(*values))
        if tracer is not None and isinstance(cond, TensorProxy):
            # the body made the condition data-dependent (a counter set in a tensor `if`,
            # see numbers.py): the iterations so far were certain, the rest is one `while` op
            return capture_while(tracer, cond_fn, body_fn, values, names, SITES[site].loc)
    return values


def for_(iterable: Any, body_fn: Any, site: int, names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A converted ``for``: unrolled in Python, or one ``for`` op over a symbolic or long range."""
    tracer = _tracer()
    iterable = _outer(iterable)
    if isinstance(iterable, TensorProxy):
        raise _reject("for", site, "a tensor (iterating over its rows)")
    if tracer is not None and isinstance(iterable, SymRange):
        return capture_for(tracer, iterable, body_fn, values, names, SITES[site].loc)
    if tracer is not None and isinstance(iterable, range) and len(iterable) > UNROLL_LIMIT and values:
        # no silent unrolling after a failed attempt: the body may have had Python
        # side effects, so a body that needs the index as a Python value is an error
        return capture_for(tracer, iterable, body_fn, values, names, SITES[site].loc)
    for item in iterable:
        values = body_fn(item, *values)
    return values


def _converted(fn: Any) -> Any:
    import cuvil.frontend.hooks as hooks_module

    try:
        if is_user_function(fn):
            return convert(fn, hooks_module)
        if isinstance(fn, types.MethodType) and is_user_function(fn.__func__):
            return types.MethodType(convert(fn.__func__, hooks_module), fn.__self__)
        if isinstance(fn, torch.nn.Module):
            forward = type(fn).forward
            if is_user_function(forward):
                converted = types.MethodType(convert(forward, hooks_module), fn)
                return with_hooks(fn, converted) if has_hooks(fn) else converted
        if isinstance(fn, types.FunctionType):  # a library function, run as is
            tracer = _tracer()
            if tracer is not None:
                tracer.reads.library_code(fn)
    except ConversionError:
        # no source: run as is (tensor ops are still captured by the tracer), guarding
        # every global and closure variable its code names
        tracer = _tracer()
        if tracer is not None:
            tracer.reads.code(getattr(fn, "__func__", fn))
    return fn


_ABSENT = object()


def with_hooks(m: torch.nn.Module, forward: Any) -> Callable[..., Any]:
    """Call ``m`` as torch does -- its hooks and torch's global hooks around it -- with
    ``forward`` (the converted forward) in place of its own for this call, so the
    forward of a hooked module is captured and its reads guarded like any other's
    (``Module._call_impl`` looks ``self.forward`` up on the instance)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        namespace = m.__dict__
        before = namespace.get("forward", _ABSENT)
        namespace["forward"] = forward
        try:
            return m(*args, **kwargs)
        finally:
            if before is _ABSENT:
                namespace.pop("forward", None)
            else:
                namespace["forward"] = before

    return call
