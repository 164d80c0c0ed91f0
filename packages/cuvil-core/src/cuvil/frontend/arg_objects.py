"""Python objects in a call's argument and result trees.

[Note: objects in the argument tree]
Arguments are flattened with ``torch.utils._pytree``, so an object reaches the traced
function in one of two ways: as a *pytree node* (tuples, lists, dicts, and any type
registered with ``register_pytree_node``, such as transformers' ``DynamicCache`` once
``register_dynamic_cache_export_support()`` ran), whose tensors become graph inputs
and which the function sees rebuilt from proxies by the type's unflatten; or as a
*leaf*, specialised by identity. Five rules keep that sound:

1. An argument leaf that holds tensors is refused: tracing would read its tensors as
   constants and store traced values into the caller's object.
2. A registered object must survive flatten/unflatten: the function runs on the
   rebuilt object, so the state that is not a tensor (flags, counters, layer types)
   must be the same in it (checked when compiling, :func:`check_round_trip`), and is
   part of the structure key (:func:`object_states`), so a call whose counter changed
   is another variant, never a stale value.
3. The caller's objects end in the state eager leaves them in: an argument whose
   flattening the function changed (``DynamicCache.update`` assigns ``self.keys``) is
   flattened again after the trace, its new leaves become graph outputs
   (:class:`WriteBack`), and after each run the object rebuilt from them is synced
   into the caller's object (:func:`write_back`), keeping the caller's objects
   (the cache, its list of layers, each layer) where the types match.
4. A result that is an argument object is the caller's object (eager returns the
   cache it was passed), found again by its path of pytree children (:func:`at`).
5. A result that is not a node but holds tensors (``GPT2Model`` returns the
   ``DynamicCache`` it built, registered or not) never hands the trace's proxies back:
   its tensors (and traced sizes) are graph outputs and each call gets a copy of the
   objects on the way to them, holding that call's values (:func:`template`,
   :func:`rebuild`); what holds no tensor is shared, like any constant result.
"""

from __future__ import annotations

import copy
import enum
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.errors import CompileError

#: values compared by value in an object's state (the rest: tensors by metadata,
#: containers and plain objects by their contents, anything else by identity)
_VALUES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, type)
#: how deep state is followed (a cache's layers hold their tensors at depth 3)
_DEPTH = 8

FIX_HINT = (
    "register its type with torch.utils._pytree.register_pytree_node so that its tensors "
    "become graph inputs and outputs (for transformers' DynamicCache: call "
    "transformers.integrations.executorch.register_dynamic_cache_export_support() once)"
)


@dataclass(frozen=True)
class WriteBack:
    """An argument the function changed in place, and how to rebuild its new state."""

    #: the argument's path of pytree children in ``(args, kwargs)``
    path: tuple[int, ...]
    name: str
    spec: pytree.TreeSpec
    #: per new leaf: ("graph", output index), ("leaf", argument leaf index) or ("const", value)
    leaves: tuple[tuple[str, Any], ...]
    #: per new leaf, where it sits in the argument (attribute names, list indices, dict
    #: keys), when the function kept the argument's structure (:func:`leaf_places`): the
    #: write-back then sets each leaf in place; None: rebuild and sync (:func:`write_back`)
    places: tuple[tuple[Any, ...], ...] | None = None


def is_object_node(x: Any) -> bool:
    """A registered pytree node of a type that is not a builtin container."""
    return type(x) in pytree.SUPPORTED_NODES and type(x) not in pytree.BUILTIN_TYPES


def attribute_object(x: Any) -> bool:
    """An object flattened by its attributes (rule 0): an instance of a Python class whose
    whole state is its ``__dict__`` (default ``__new__``, no slots), not registered with
    pytree, and not a module, tensor, enum member, class or function."""
    t = type(x)
    ok = _ATTRIBUTE_TYPES.get(t)
    if ok is None:
        ok = (
            t not in pytree.SUPPORTED_NODES
            and bool(t.__flags__ & _HEAPTYPE)
            and t.__new__ is object.__new__
            and "__dict__" in dir(t)
            and not issubclass(t, (torch.Tensor, torch.nn.Module, enum.Enum, BaseException, type, *_SYMBOLIC))
            and not any(getattr(c, "__slots__", ()) for c in t.__mro__ if "__slots__" in vars(c))
        )
        _ATTRIBUTE_TYPES[t] = ok
    return ok and not isinstance(x, _VALUES)


#: torch's symbolic numbers: values (a traced size), never objects to flatten
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, not a C type
#: attribute_object's answer per type (types are immortal enough: classes rarely die)
_ATTRIBUTE_TYPES: dict[type, bool] = {}


class ObjectNode:
    """Stands for an attribute object in a flattened argument tree: its class, its
    attribute names and values. Unflattening builds an instance of the class again
    (``cls.__new__`` and the attributes, no ``__init__``), so the function runs on an
    object of the caller's type whose tensors are graph inputs."""

    __slots__ = ("cls", "keys", "values")

    def __init__(self, cls: type, keys: tuple[str, ...], values: list[Any]) -> None:
        self.cls, self.keys, self.values = cls, keys, values


def _flatten_object(n: ObjectNode) -> tuple[list[Any], Any]:
    return n.values, (n.cls, n.keys)


def _flatten_object_with_keys(n: ObjectNode) -> tuple[list[tuple[Any, Any]], Any]:
    return [(pytree.GetAttrKey(k), v) for k, v in zip(n.keys, n.values)], (n.cls, n.keys)


def _unflatten_object(values: Any, context: Any) -> Any:
    cls, keys = context
    obj = cls.__new__(cls)
    vars(obj).update(zip(keys, values))
    return obj


pytree.register_pytree_node(
    ObjectNode,
    _flatten_object,
    _unflatten_object,
    serialized_type_name="cuvil.frontend.arg_objects.ObjectNode",
    flatten_with_keys_fn=_flatten_object_with_keys,
)


class SizeArg(int):
    """An int attribute of an attribute object, as a leaf of a flattened argument tree
    under ``dynamic=True``: a size symbol of the compiled code, not a constant.

    [Note: int attributes are sizes]
    Objects carry their lengths in ints: a static cache's ``max_cache_len`` (the prompt
    plus the new tokens), a sliding-window layer's ``cumulative_length`` (one more every
    step), its ``sliding_window``. Specialized by value, each new value is a compile.
    So under ``dynamic=True`` an int attribute of an attribute object (rule 0) is what a
    tensor's dimension is: a size symbol named after its place
    (``cache_layers_0_max_cache_len``), with the call's value as its hint. The structure
    key holds only that it is a size; the code sees a ``torch.SymInt``, so what it
    decides about the value (``if self.cumulative_length >= self.sliding_window``)
    becomes a size assumption checked on every call, exactly as for tensor sizes, and
    arithmetic on it stays symbolic (the new ``cumulative_length`` is a traced size
    written back as an int). The graph gets the value through a hidden input of shape
    ``(n, 0)`` (no memory), whose dimension binds the symbol like any other. The value 0
    stays specialized (a plain int in the key): it decides most branches (an empty
    cache, a count not started). 1 is a size like a tensor dimension of 1 is: a static
    cache's ``batch_size`` of 1 and of 4 are one variant (torch's kernels take their
    general path for a size that only might be 1: [Note: torch's general path for
    sizes] in cuvil_ir/graph_ir/fake.py), and code asking ``n == 1`` is guarded on it.
    Plain int *arguments* and ints in
    registered pytree nodes or containers keep their value in the structure key: an int
    passed to a function is as often a mode or a count to unroll as a size. Code that
    needs the value itself (a Python loop over ``range(opts.n)`` appending to a list,
    which cannot be a captured loop over a size) fails to capture that way; the call is
    then captured again with the ints as values, and they stay values for that compiled
    function (``CompiledFunction.int_sizes``; ``stats.notes`` says why).
    """

    __slots__ = ()


def size_arg(value: Any) -> Any:
    """``value`` as the leaf :class:`SizeArg` when it is an int that becomes a size
    symbol ([Note: int attributes are sizes]), else unchanged."""
    return SizeArg(value) if type(value) is int and value > 0 else value


def plain(value: Any) -> Any:
    """A leaf as the caller's value (a :class:`SizeArg` as the int it stands for)."""
    return int(value) if type(value) is SizeArg else value


def lift(tree: Any, sizes: bool = False, registered: list[Any] | None = None) -> Any:
    """``tree`` with every attribute object in it replaced by an :class:`ObjectNode`
    (inside builtin containers and other attribute objects); ``tree`` itself when it holds
    none. An object met twice (shared, or a cycle) stays a leaf: flattening cannot keep
    the sharing. With ``sizes``, the int attributes of attribute objects are
    :class:`SizeArg` leaves ([Note: int attributes are sizes]). ``registered`` collects
    the registered pytree objects met (:func:`is_object_node`), and what lies deeper
    than it looks (which may hold some)."""
    # one walk, counting the attribute objects met; a second, which keeps the shared ones
    # as leaves, only when one was met twice (rare: a call's objects seldom share)
    seen: dict[int, int] = {}
    found: list[Any] = []
    out = _lift(tree, seen, 0, sizes, found, counting=True)
    if any(n > 1 for n in seen.values()):
        seen = {}
        _count(tree, seen, 0)
        found.clear()
        out = _lift(tree, seen, 0, sizes, found, counting=False)
    if registered is not None:
        registered += found
    return out


#: what lift and _count never look into
_LEAVES = (torch.Tensor, *_VALUES)


def _count(x: Any, seen: dict[int, int], depth: int) -> None:
    if isinstance(x, _LEAVES) or depth > _DEPTH:
        return
    if attribute_object(x):
        seen[id(x)] = seen.get(id(x), 0) + 1
        if seen[id(x)] > 1:
            return
        kids: Any = vars(x).values()
    elif type(x) in pytree.BUILTIN_TYPES or pytree.is_namedtuple_instance(x):
        kids = _children(x)
    else:
        return
    for k in kids:
        _count(k, seen, depth + 1)


def _lift(x: Any, seen: dict[int, int], depth: int, sizes: bool, found: list[Any], counting: bool) -> Any:
    """``x`` lifted; ``counting``: count the attribute objects in ``seen`` as they are met
    (the first walk), else keep those ``seen`` counted twice as leaves."""
    if isinstance(x, _LEAVES):
        return x
    if depth > _DEPTH:
        found.append(x)  # not looked into: may hold registered objects (object_states walks)
        return x
    if attribute_object(x):
        if counting:
            seen[id(x)] = seen.get(id(x), 0) + 1
        elif seen.get(id(x), 0) > 1:
            return x
        d = vars(x)
        values = [_lift(v, seen, depth + 1, sizes, found, counting) for v in d.values()]
        return ObjectNode(type(x), tuple(d), [size_arg(v) for v in values] if sizes else values)
    if type(x) in pytree.BUILTIN_TYPES or pytree.is_namedtuple_instance(x):
        handler = pytree.SUPPORTED_NODES[pytree._get_node_type(x)]
        kids, context = handler.flatten_fn(x)
        new = [_lift(k, seen, depth + 1, sizes, found, counting) for k in kids]
        if all(a is b for a, b in zip(new, kids)):
            return x
        return handler.unflatten_fn(new, context)
    if is_object_node(x):
        found.append(x)
    return x


def flatten(
    tree: Any, sizes: bool = False, registered: list[Any] | None = None
) -> tuple[list[Any], pytree.TreeSpec]:
    """``pytree.tree_flatten`` of an argument tree, attribute objects flattened by their
    attributes (:func:`lift`; ``sizes``: their int attributes as :class:`SizeArg`;
    ``registered`` collects the registered pytree objects in it)."""
    return pytree.tree_flatten(lift(tree, sizes, registered))  # type: ignore[no-any-return]


def flatten_with_path(tree: Any) -> tuple[list[tuple[Any, Any]], pytree.TreeSpec]:
    """``pytree.tree_flatten_with_path`` of an argument tree, as :func:`flatten` flattens it."""
    return pytree.tree_flatten_with_path(lift(tree))  # type: ignore[no-any-return]


def _children(node: Any) -> list[Any]:
    if attribute_object(node):
        return list(vars(node).values())
    return list(pytree.SUPPORTED_NODES[pytree._get_node_type(node)].flatten_fn(node)[0])


def _is_node(x: Any) -> bool:
    return not pytree.tree_is_leaf(x) or attribute_object(x)


def nodes(tree: Any) -> Iterator[tuple[tuple[int, ...], Any]]:
    """Every pytree node below ``tree`` (not ``tree`` itself), with its path, parents first."""
    seen: dict[int, int] = {}
    _count(tree, seen, 0)

    def node(c: Any, depth: int) -> bool:  # as lift decides: a shared object is a leaf
        if attribute_object(c):
            return depth <= _DEPTH and seen.get(id(c), 0) == 1
        return _is_node(c)

    stack = [((), tree)]
    while stack:
        path, n = stack.pop()
        if path:
            yield path, n
        kids = _children(n)
        stack += [((*path, i), c) for i, c in reversed(list(enumerate(kids))) if node(c, len(path) + 1)]


def at(tree: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        tree = _children(tree)[i]
    return tree


def has_objects(spec: pytree.TreeSpec) -> bool:
    """Whether an argument tree of this structure holds registered objects (cheap: the spec)."""
    if spec.type not in pytree.BUILTIN_TYPES and spec.type in pytree.SUPPORTED_NODES:
        return True
    return any(has_objects(c) for c in spec.children())


def object_states(tree: Any, registered: list[Any] | None = None) -> tuple[Any, ...]:
    """The state of every registered object in ``tree`` but its tensors' values and sizes:
    part of the structure key (rule 2). ``registered``: what :func:`flatten` found of them
    (none found: no walk)."""
    if registered is not None and not registered:
        return ()
    return tuple(state(node) for _, node in nodes(tree) if is_object_node(node))


def state(obj: Any) -> tuple[Any, ...]:
    """``obj``'s state as (where, what) pairs: tensors by dtype, device and rank, values
    by value, containers and plain objects by their contents."""
    out: list[tuple[str, Any]] = []
    _state(obj, type(obj).__name__, 0, out)
    return tuple(out)


def _state(obj: Any, where: str, depth: int, out: list[tuple[str, Any]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((where, ("tensor", obj.dtype, obj.device.type, obj.dim())))
    elif isinstance(obj, _SYMBOLIC):
        # a size or number symbol while a capture runs: its expression, not its attributes
        # (a walk into its node reaches the shape environment: thousands of entries whose
        # printing was most of a decoder's compile time)
        out.append((where, (type(obj), obj.node.expr)))
    elif isinstance(obj, _VALUES):
        out.append((where, (type(obj), obj)))
    elif depth >= _DEPTH:
        out.append((where, ("object", id(obj))))
    elif isinstance(obj, (list, tuple, deque)):
        out.append((where, (type(obj), len(obj))))
        for i, x in enumerate(obj):
            _state(x, f"{where}[{i}]", depth + 1, out)
    elif isinstance(obj, dict):
        out.append((where, (type(obj), tuple(map(repr, obj)))))
        for k, x in obj.items():
            _state(x, f"{where}[{k!r}]", depth + 1, out)
    elif _plain_object(obj):
        out.append((where, (type(obj), tuple(sorted(vars(obj))))))
        for k, x in sorted(vars(obj).items()):
            _state(x, f"{where}.{k}", depth + 1, out)
    else:
        out.append((where, ("object", id(obj))))


def _plain_object(obj: Any) -> bool:
    """An instance whose attributes are its state (not a module, class, function or nn.Module)."""
    return hasattr(obj, "__dict__") and not isinstance(
        obj, (type, torch.nn.Module, type(_plain_object), type(pytree))
    )


def check_round_trip(tree: Any, name_of: Any) -> None:
    """Rule 2: every registered object in ``tree`` rebuilds from its leaves with the same
    state (``name_of(path)`` names the argument in errors)."""
    for path, node in nodes(tree):
        if not is_object_node(node):
            continue
        leaves, spec = pytree.tree_flatten(node)
        before, after = state(node), state(pytree.tree_unflatten(leaves, spec))
        if before != after:
            raise CompileError(
                f"argument {name_of(path)} (a {type(node).__name__}) does not survive pytree "
                f"flattening: {difference(before, after, 'in the argument')}; the compiled function "
                "runs on the rebuilt object, so it would compute with other values than eager",
                hint=_KEEP_HINT.format(type(node).__name__),
            )


_KEEP_HINT = (
    "make the flatten function of {} keep that state (in its leaves or its context), or "
    "pass the value as an argument of its own"
)


def check_changed(after: tuple[Any, ...], rebuilt: tuple[Any, ...], name: str, kind: str) -> None:
    """Rule 3 needs the state a function leaves in a registered object to survive flattening
    (else the write-back would silently drop it): ``after`` is the traced object's state at
    the end of the trace, ``rebuilt`` that of the object rebuilt from its new leaves."""
    if after != rebuilt:
        raise CompileError(
            f"the function changes argument {name} (a {kind}) in a way its pytree flattening "
            f"loses: {difference(after, rebuilt, 'after the call')}, so the change could not be "
            "written back",
            hint=_KEEP_HINT.format(kind),
        )


def difference(a: tuple[Any, ...], b: tuple[Any, ...], a_is: str) -> str:
    """The first place two :func:`state` results differ, in words."""
    diff = next(((x, y) for x, y in zip(a, b) if x != y), None)
    if diff is None:
        return "the rebuilt object has other attributes"
    return f"{diff[0][0]} is {_show(diff[0][1])} {a_is} but {_show(diff[1][1])} when rebuilt"


def _show(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], type):
        return repr(key[1]) if key[0] is not type else key[1].__name__
    return str(key)


def tensor_path(obj: Any, where: str = "") -> str | None:
    """Where a tensor sits inside ``obj`` (``.layers[0].keys``), or None: a leaf holding
    one must not be traced through (rule 1)."""
    seen: set[int] = set()
    stack = [(obj, where, 0)]
    while stack:
        x, at_, depth = stack.pop()
        if isinstance(x, torch.Tensor):
            return at_
        if id(x) in seen or depth > _DEPTH or isinstance(x, _VALUES):
            continue
        seen.add(id(x))
        if isinstance(x, (list, tuple, deque, set, frozenset)):
            kids = [(v, f"{at_}[{i}]") for i, v in enumerate(x)]
        elif isinstance(x, dict):
            kids = [(v, f"{at_}[{k!r}]") for k, v in x.items()]
        elif isinstance(x, torch.nn.Module):
            if next(x.parameters(), None) is not None or next(x.buffers(), None) is not None:
                return f"{at_}.parameters()"
            continue
        elif _plain_object(x):
            kids = [(v, f"{at_}.{k}") for k, v in vars(x).items()]
        else:
            kids = [(getattr(x, k), f"{at_}.{k}") for k in _slots(type(x)) if hasattr(x, k)]
        stack += [(v, w, depth + 1) for v, w in reversed(kids)]  # first found: first in order
    return None


def _slots(t: type) -> list[str]:
    """The slot attributes of instances of ``t`` (``__slots__`` along its MRO)."""
    out: list[str] = []
    for c in t.__mro__:
        slots = vars(c).get("__slots__", ())
        out += (
            [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
        )
    return out


def check_leaf(leaf: Any, name: str) -> None:
    """Rule 1 for an argument leaf."""
    inner = tensor_path(leaf)
    if inner is not None:
        raise CompileError(
            f"argument {name} is a {type(leaf).__name__} that holds tensors ({name}{inner}) but is "
            "not a pytree node: its tensors would be traced as constants and traced values "
            "stored into it",
            hint=FIX_HINT,
        )


def check_plain(leaf: Any, what: str) -> None:
    """A value that must hold no tensor (a new leaf of a changed argument, rule 3)."""
    inner = tensor_path(leaf)
    if inner is not None:
        raise CompileError(
            f"{what} is a {type(leaf).__name__} that holds tensors ({inner.lstrip('.')}) but is "
            "not a pytree node, so its tensors cannot become outputs",
            hint=FIX_HINT,
        )


_TRACED = (torch.Tensor, torch.SymInt, torch.SymFloat)


def template(obj: Any, output: Any) -> Any:
    """Rule 5: the skeleton of a result object that holds traced values, or None when it
    holds none. ``output(value)`` makes a traced value a graph output and returns its
    index. A skeleton node is ``("value", index)`` or ``("copy", object, ((key, node), ...))``:
    copy the object and put the rebuilt children at those keys."""
    memo: dict[int, Any] = {}
    busy: set[int] = set()

    def walk(x: Any, where: str, depth: int) -> Any:
        if isinstance(x, _TRACED):
            return ("value", output(x))
        if isinstance(x, _VALUES) or isinstance(x, torch.SymBool) or depth > _DEPTH:
            return None
        if id(x) in memo:
            return memo[id(x)]
        if id(x) in busy:
            raise CompileError(
                f"the function returns an object that refers to itself ({where}) and holds tensors",
                hint=FIX_HINT,
            )
        if isinstance(x, torch.nn.Module):
            if tensor_path(x) is None:
                return None
            raise CompileError(
                f"the function returns a module holding tensors ({where or type(x).__name__})",
                hint="return its outputs or tensors instead",
            )
        if isinstance(x, (list, tuple)):
            items: Any = enumerate(x)
        elif isinstance(x, dict):
            items = x.items()
        elif _plain_object(x):
            items = vars(x).items()
        else:
            return None
        busy.add(id(x))
        kids = []
        for k, v in list(items):
            node = walk(v, f"{where}.{k}" if _plain_object(x) else f"{where}[{k!r}]", depth + 1)
            if node is not None:
                kids.append((k, node))
        busy.discard(id(x))
        memo[id(x)] = ("copy", x, tuple(kids)) if kids else None
        return memo[id(x)]

    return walk(obj, "", 0)


def rebuild(node: Any, results: Any) -> Any:
    """One call's copy of a :func:`template` skeleton, holding this call's values."""
    memo: dict[int, Any] = {}

    def make(n: Any) -> Any:
        if n[0] == "value":
            return results[n[1]]
        if id(n) in memo:  # an object the result refers to twice stays one object
            return memo[id(n)]
        orig, kids = n[1], n[2]
        if isinstance(orig, tuple):
            items = list(orig)
            for k, c in kids:
                items[k] = make(c)
            new = type(orig)(*items) if pytree.is_namedtuple_instance(orig) else type(orig)(items)
        elif isinstance(orig, list):
            new = copy.copy(orig)
            for k, c in kids:
                new[k] = make(c)
        elif isinstance(orig, dict):
            new = copy.copy(orig)
            for k, c in kids:
                new[k] = make(c)
        else:
            new = copy.copy(orig)
            for k, c in kids:
                vars(new)[k] = make(c)
        memo[id(n)] = new
        return new

    return make(node)


def check_syncable(obj: Any, name: str) -> None:
    """Rule 3 needs each changed registered object's attributes to be writable."""
    for _, node in [((), obj), *nodes(obj)]:
        if is_object_node(node) and not _plain_object(node):
            raise CompileError(
                f"the function changes argument {name} in place, and its {type(node).__name__} "
                "has no attributes (__dict__) that the change could be written back to",
                hint="return the new value instead of changing the argument",
            )


def write_back(writes: tuple[WriteBack, ...], results: Any, leaves: list[Any], tree: Any) -> None:
    """Rule 3 after a run: rebuild each changed argument and sync it into the caller's, or,
    when the function kept its structure, set each new leaf in place."""
    for w in writes:
        new = [
            results[v] if kind == "graph" else plain(leaves[v]) if kind == "leaf" else v
            for kind, v in w.leaves
        ]
        target = at(tree, w.path)
        if w.places is None:
            _sync(target, pytree.tree_unflatten(new, w.spec), 0)
            continue
        for place, value in zip(w.places, new):
            owner = target
            for step in place[:-1]:
                owner = getattr(owner, step) if type(step) is str else owner[step[0]]
            last = place[-1]
            if type(last) is str:
                vars(owner)[last] = value
            else:
                owner[last[0]] = value


def leaf_places(new_spec: pytree.TreeSpec, spec: pytree.TreeSpec, path: tuple[int, ...]) -> Any:
    """Where each leaf of ``new_spec`` (an argument as the function left it) sits in the
    argument, when the function kept the argument's structure: ``new_spec`` equals the
    argument's part of ``spec`` (the call's argument tree: the structure key holds it, so
    every call of the variant passes an argument of exactly this structure), and every
    container on the way is an attribute object, a list or a dict (set in place). A step is
    an attribute name, or ``(index,)`` / ``(key,)``. None otherwise: the write-back rebuilds
    the argument and syncs it (:func:`write_back`)."""
    sub = spec
    for i in path:
        sub = sub.children()[i]
    if sub != new_spec:
        return None
    places: list[tuple[Any, ...]] = []
    if not _places(new_spec, (), places) or not all(places):
        return None
    return tuple(places)


def _places(node: pytree.TreeSpec, at_: tuple[Any, ...], out: list[tuple[Any, ...]]) -> bool:
    """Append the place of each leaf under ``node`` (at ``at_``) in flattening order; False
    when a container on the way cannot be set in place (a tuple, a registered type)."""
    if node.is_leaf():
        out.append(at_)
        return True
    kids = node.children()
    if node.type is ObjectNode:
        steps: list[Any] = list(node.context[1])
    elif node.type is list:
        steps = [(i,) for i in range(len(kids))]
    elif node.type is dict:
        steps = [(k,) for k in node.context]
    else:
        return False
    return all(_places(kid, (*at_, step), out) for kid, step in zip(kids, steps))


def _sync(user: Any, fresh: Any, depth: int) -> Any:
    """Make ``user`` hold what ``fresh`` holds, in place where it can (containers and plain
    objects of the same type), and return what the parent should hold."""
    if user is fresh or type(user) is not type(fresh) or depth > _DEPTH:
        return fresh
    if isinstance(user, list):
        user[:] = [_sync(user[i], f, depth + 1) if i < len(user) else f for i, f in enumerate(fresh)]
        return user
    if isinstance(user, dict):
        new = {k: _sync(user[k], v, depth + 1) if k in user else v for k, v in fresh.items()}
        user.clear()
        user.update(new)
        return user
    if isinstance(user, deque):
        new_items = [_sync(user[i], f, depth + 1) if i < len(user) else f for i, f in enumerate(fresh)]
        user.clear()
        user.extend(new_items)
        return user
    if isinstance(user, tuple):
        if len(user) != len(fresh):
            return fresh
        items = [_sync(u, f, depth + 1) for u, f in zip(user, fresh)]
        if all(a is b for a, b in zip(items, user)):
            return user
        return type(user)(*items) if pytree.is_namedtuple_instance(user) else type(user)(items)
    if _plain_object(user) and not isinstance(user, torch.Tensor):
        mine, theirs = vars(user), vars(fresh)
        new = {k: _sync(mine[k], v, depth + 1) if k in mine else v for k, v in theirs.items()}
        mine.clear()
        mine.update(new)
        return user
    return fresh


__all__ = [
    "FIX_HINT",
    "WriteBack",
    "at",
    "check_leaf",
    "check_changed",
    "check_plain",
    "check_round_trip",
    "check_syncable",
    "difference",
    "has_objects",
    "is_object_node",
    "nodes",
    "object_states",
    "rebuild",
    "state",
    "template",
    "tensor_path",
    "write_back",
]
