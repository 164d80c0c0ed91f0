"""Guards: what a compiled artifact assumed about its inputs, checked on each call.

Three layers, cheapest first:

1. the *structure key*: the argument tree, each tensor's dtype/device/rank
   (and sizes with ``dynamic=False``), each Python value (specialised), the
   module's parameter metadata and training flags -- compared as one tuple;
2. the *read guards* (:class:`ReadGuards`): every global, closure variable and
   attribute the traced code read, re-read through a getter bound at capture and
   compared with what capture saw (value, identity, container contents, tensor
   metadata) -- see [Note: reads are guarded];
3. the graph's *assumptions* on size symbols (``Eq(x_1, 16)``, ``Ne(x_0, 1)``),
   compiled once into a Python predicate over the bound sizes.

When no artifact passes, :func:`explain_miss` says which guard failed, in
words, for ``stats.recompile_reasons``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from cuvil.frontend.arg_objects import SizeArg
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import exact_function

_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device)

# [Note: places]
# A place says where a value lives in terms another process can follow, so a
# compiled variant saved in the cache can re-create its guards there (cuvil/warm.py):
#   ("module", name)             sys.modules[name]
#   ("global", module, name)     a variable of that module
#   ("root",)                    the compiled function itself (its __defaults__)
#   ("closure", name)            a closure cell of the compiled (root) function
#   ("self", path)               the compiled module, or its submodule at path ("" for itself)
#   ("attr", place, name)        an attribute of the object at place
#   ("environ", name)            the environment variable name (unset: MISSING)
# Reads of anything else (an object argument, a closure cell of a helper) have none,
# and a variant with such a read is kept in this process only.
Place = tuple[Any, ...]


def leaf_key(leaf: Any, dynamic: bool) -> tuple[Any, ...]:
    """What a compiled artifact depends on for one argument leaf."""
    if isinstance(leaf, torch.Tensor):
        # the layout and nesting first: a sparse or nested tensor has no usable shape/strides,
        # and must never match an artifact compiled for dense ones (cuvil/arguments.py)
        if leaf.layout is not torch.strided or leaf.is_nested:
            return ("tensor", leaf.dtype, leaf.device, -1, None, str(leaf.layout), leaf.is_nested)
        shape = None if dynamic else tuple(leaf.shape)
        # whether this call records autograd history: such calls run eagerly, never compiled
        return (
            "tensor",
            leaf.dtype,
            leaf.device,
            leaf.dim(),
            shape,
            leaf.requires_grad and torch.is_grad_enabled(),
        )
    if type(leaf) is SizeArg:  # a size symbol, not a value: [Note: int attributes are sizes]
        return ("size", int)
    if isinstance(leaf, _SCALARS):
        return ("value", type(leaf), leaf)
    return ("object", type(leaf), id(leaf))


def describe_leaf(key: tuple[Any, ...]) -> str:
    if key[0] == "tensor":
        try:
            dtype = DType.from_torch(key[1]).value
        except (TypeError, ValueError, KeyError):
            dtype = str(key[1])
        if len(key) == 7:
            return f"a {'nested' if key[6] else key[5]} tensor of {key[1]} on {key[2]}"
        shape = "" if key[4] is None else f", shape {list(key[4])}"
        grad = " requiring grad (grad mode on)" if key[5] else ""
        return f"a {dtype} tensor of rank {key[3]} on {key[2]}{shape}{grad}"
    if key[0] == "value":
        return f"{key[1].__name__} {key[2]!r}"
    if key[0] == "size":
        return "an int (a size symbol)"
    return f"a {key[1].__name__} object (id {key[2]})"


@dataclass(frozen=True, slots=True)
class SymbolSlot:
    """Where a size symbol is read from: leaf ``leaf``'s dimension ``axis``, or with axis
    -1 the leaf itself (an int attribute: [Note: int attributes are sizes])."""

    symbol: sympy.Symbol
    leaf: int
    axis: int
    leaf_name: str


class AssumptionCheck:
    """The graph's assumptions as one fast predicate over the inputs' sizes, and the
    layout guards: ``(leaf, order, name)``, argument leaf ``leaf`` is contiguous in the
    dim order ``order`` (``leaf.permute(order).is_contiguous()``), which traced code
    asking ``is_contiguous()`` was answered from (cuvil/frontend/layout.py)."""

    def __init__(
        self,
        assumptions: Sequence[sympy.Basic],
        slots: Sequence[SymbolSlot],
        reasons: dict[Any, str],
        layouts: Sequence[tuple[int, tuple[int, ...], str]] = (),
        fixed: Sequence[tuple[int, int, int, str]] = (),
    ):
        self.layouts = tuple((int(i), tuple(int(d) for d in o), str(n)) for i, o, n in layouts)
        #: (leaf, axis, size, name): a size kept static under dynamic shapes (``dims`` None)
        self.fixed = tuple((int(i), int(a), int(n), str(name)) for i, a, n, name in fixed)
        self.assumptions = tuple(assumptions)
        self.slots = tuple(slots)
        self.reasons = reasons
        self.symbols = sorted({s.symbol for s in slots}, key=lambda s: s.name)
        self._index = {s: i for i, s in enumerate(self.symbols)}
        self._all: Callable[..., bool] | None = None
        if self.assumptions:
            # exact, not float arithmetic: see [Note: exact size arithmetic] in cuvil_ir.symbolic
            self._all = exact_function(self.symbols, sympy.And(*self.assumptions))

    def bind(self, leaves: Sequence[Any]) -> list[int] | str:
        """Symbol values from the leaves, or a message when two inputs disagree."""
        values: list[int | None] = [None] * len(self.symbols)
        for slot in self.slots:
            leaf = leaves[slot.leaf]
            size = int(leaf) if slot.axis < 0 else int(leaf.shape[slot.axis])
            i = self._index[slot.symbol]
            if values[i] is None:
                values[i] = size
            elif values[i] != size:
                where = slot.leaf_name if slot.axis < 0 else f"{slot.leaf_name}.shape[{slot.axis}]"
                return f"{slot.symbol} is {values[i]} elsewhere but {where} is {size}"
        return values  # type: ignore[return-value]

    def holds(self, leaves: Sequence[Any]) -> bool:
        for i, axis, size, _ in self.fixed:
            if leaves[i].shape[axis] != size:
                return False
        for i, order, _ in self.layouts:
            if not leaves[i].permute(order).is_contiguous():
                return False
        values = self.bind(leaves)
        if isinstance(values, str):
            return False
        return self._all is None or bool(self._all(*values))

    def explain(self, leaves: Sequence[Any]) -> str:
        for i, axis, size, name in self.fixed:
            if leaves[i].shape[axis] != size:
                return (
                    f"static size guard: {name}.shape[{axis}] is {int(leaves[i].shape[axis])}, it was {size}"
                )
        for i, order, name in self.layouts:
            if not leaves[i].permute(order).is_contiguous():
                was = (
                    "contiguous"
                    if order == tuple(range(len(order)))
                    else f"contiguous in the dim order {list(order)}"
                )
                return (
                    f"layout guard: {name} was {was} when compiled (traced code asked is_contiguous()), "
                    f"now its strides are {list(leaves[i].stride())}"
                )
        values = self.bind(leaves)
        if isinstance(values, str):
            return values
        env = dict(zip(self.symbols, values))
        for a in self.assumptions:
            if not bool(a.xreplace(env)):
                why = self.reasons.get(a)
                shown = ", ".join(f"{s} = {env[s]}" for s in sorted(a.free_symbols, key=str) if s in env)
                return f"size guard {sympy.sstr(a)} failed ({shown})" + (f"; assumed at {why}" if why else "")
        return "all size guards hold"


# [Note: reads are guarded]
# Converted code reads globals, closure variables and attributes through hooks
# (``hooks.glob``/``free``/``attr``, see cuvil/frontend/scopes.py); each read adds one
# ReadGuard whose getter re-reads the same place on a later call (``dict.get`` on the
# globals dict, the cell's contents, ``getattr`` on the identity-guarded owner) and
# whose kind says how to compare. Tensors are not baked in: they are graph inputs read
# by the same getter on every call (an in-place update is seen), and their guard only
# checks the metadata the graph was traced for. Guards run in read order, so an
# attribute's guard may bind its owner object directly: the owner's identity guard
# comes first. Library Python modules (torch, math, ...) are constants by identity.
# A mutable buffer (a numpy array, a bytearray) is guarded by value, its bytes: code
# that reads its items (``int(ARR[0])``) runs on the Python value at capture, so a
# changed item recompiles instead of being frozen.


class _Missing:
    def __repr__(self) -> str:
        return "<unset>"


MISSING: Any = _Missing()


class Same:
    """A container element compared by identity (holds a reference, so ids stay valid)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} object>"


def contents_key(value: Any, depth: int = 0) -> Any:
    """A list/tuple/dict/set by contents: scalars by value, anything else by identity."""
    if isinstance(value, _SCALARS):
        return (type(value), value)
    if is_buffer(value):  # a numpy array in a list: its items, not the array object
        return buffer_key(value)
    if depth < 4 and type(value) in (list, tuple):
        return (type(value), tuple(contents_key(v, depth + 1) for v in value))
    if depth < 4 and type(value) is dict:
        return (dict, tuple((Same(k), contents_key(v, depth + 1)) for k, v in value.items()))
    if depth < 4 and type(value) in (set, frozenset):
        return (type(value), frozenset(contents_key(v, depth + 1) for v in value))
    return Same(value)


def is_buffer(value: Any) -> bool:
    """A Python object whose memory can change in place without rebinding it (a numpy
    array, a ``bytearray``, an ``array.array``): reading its items reads that memory."""
    if isinstance(value, (torch.Tensor, bytes, str, memoryview)):
        return False
    if hasattr(value, "__array_interface__"):
        return True
    try:
        memoryview(value).release()
    except TypeError:
        return False
    return True


def buffer_key(value: Any) -> Any:
    """A buffer by value: its type, element format, shape and bytes. A numpy array that
    exports no buffer has none, nor has an object array, whose bytes are the addresses of
    its elements (a freed element's address can be reused): see :meth:`Reads.read`."""
    try:
        with memoryview(value) as view:
            if "O" not in view.format:
                return (type(value), view.format, view.shape, view.tobytes())
    except (TypeError, ValueError):
        pass
    return ("no buffer", type(value), id(value))


def tensor_key(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return ("not a tensor", type(value))
    return (value.dtype, value.device, tuple(value.shape))


def _method_key(value: Any) -> Any:
    if isinstance(value, types.MethodType):
        return (Same(value.__func__), Same(value.__self__))
    return Same(value)


#: guard kind -> how the current value is reduced before ``==`` with the expected one
_KEYS: dict[str, Callable[[Any], Any]] = {
    "contents": contents_key,
    "tensor": tensor_key,
    "method": _method_key,
    "buffer": buffer_key,
}


@dataclass(frozen=True, slots=True)
class ReadGuard:
    """One place the traced code read: ``what`` names it (``global 'k'``)."""

    what: str
    getter: Callable[[], Any]
    kind: str  # "value" | "identity" | "contents" | "tensor" | "method" | "state" | "buffer"
    expected: Any
    shown: str  # the value at capture, for messages
    #: how another process finds the same place (see [Note: places]), or None
    place: Place | None = None

    def current(self) -> Any:
        try:
            return self.getter()
        except Exception:  # a deleted global, an empty cell, a removed attribute
            return MISSING

    def holds(self) -> bool:
        cur = self.current()
        kind = self.kind
        if kind == "identity":
            return cur is self.expected
        if kind == "value":
            exp = self.expected
            return cur is exp or (type(cur) is type(exp) and cur == exp)
        if kind == "tensor":  # (dtype, device, shape) without building a key
            exp = self.expected
            return (
                isinstance(cur, torch.Tensor)
                and cur.dtype is exp[0]
                and cur.shape == exp[2]
                and cur.device == exp[1]
            )
        if kind == "state":  # a StateView ([Note: module state guards] in cuvil.frontend.object_state)
            return bool(self.expected.holds(cur))
        return bool(_KEYS[kind](cur) == self.expected)


def show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = DType.from_torch(value.dtype).value
        return f"a {dtype} tensor of shape {list(value.shape)} on {value.device}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ReadGuards:
    """The read guards of one artifact, checked in order on each call."""

    __slots__ = ("_others", "_states_unchanged", "guards")

    def __init__(self, guards: Sequence[ReadGuard]) -> None:
        self.guards = tuple(guards)
        states = [g for g in self.guards if g.kind == "state"]
        self._states_unchanged: Callable[[], bool] | None = None
        self._others = self.guards
        if states:
            from cuvil.frontend.object_state import fast_check

            # the module state guards of a whole model as one generated check; only
            # when it fails are they compared one by one (an equal value rebound)
            self._states_unchanged = fast_check([(g.getter, g.expected) for g in states])
            self._others = tuple(g for g in self.guards if g.kind != "state")

    def __len__(self) -> int:
        return len(self.guards)

    def holds(self) -> bool:
        if self._states_unchanged is not None and not self._states_unchanged():
            return all(g.holds() for g in self.guards)
        for g in self._others:
            if not g.holds():
                return False
        return True

    def explain(self) -> str:
        for g in self.guards:
            if not g.holds():
                cur = g.current()
                if g.kind == "state":
                    return f"{g.what} changed: {g.expected.changed(cur)}"
                return f"{g.what} changed: {g.shown} -> {show(cur)}"
        return "all read guards hold"


def explain_structure(
    names: Sequence[str],
    old: tuple[Any, ...],
    new: tuple[Any, ...],
    extra_old: Any,
    extra_new: Any,
    old_names: Sequence[str] = (),
) -> str:
    if old_names and list(old_names) != list(names):
        # an argument passed now and left to its default before (or the reverse): calls
        # are traced as made, so that is another call ([Note: calls are replayed as made])
        before, now = dict(zip(old_names, old)), dict(zip(names, new))
        added = [f"argument {n} ({describe_leaf(now[n])})" for n in names if n not in before]
        gone = [f"argument {n}" for n in old_names if n not in now]
        parts = ([f"{', '.join(added)} passed now"] if added else []) + (
            [f"{', '.join(gone)} not passed now (its default is used)"] if gone else []
        )
        if parts:
            return "; ".join(parts)
    if len(old) != len(new):
        return f"the arguments changed structure ({len(old)} leaves before, {len(new)} now)"
    for name, a, b in zip(names, old, new):
        if a != b:
            return f"argument {name}: was {describe_leaf(a)}, now {describe_leaf(b)}"
    if extra_old != extra_new:
        return "module state changed (training mode, submodules, or parameter/buffer metadata)"
    return "the argument tree changed structure"
