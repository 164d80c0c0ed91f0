"""Reads of long-lived Python state during capture, turned into read guards.

The hooks ``glob``/``free``/``attr`` (emitted by :mod:`cuvil.frontend.scopes`) and
the static fallback for functions that cannot be converted report each read
here. What a read becomes depends on the value (see [Note: reads are guarded] in
:mod:`cuvil.guards`):

- a tensor: a graph input read through the same getter on every call, guarded
  by its metadata (dtype, device, shape);
- a Python scalar (``int``, ``float``, ``str``, ``None``, a dtype ...): guarded by value;
- a ``list``/``tuple``/``dict``/``set``: guarded by contents (scalars by value,
  other elements by identity);
- a library Python module (``torch``, ``math``): a constant, not guarded, but the
  attributes read from it are (``torch.relu`` by identity, ``math.pi`` by value);
- anything else (functions, classes, user modules, objects): guarded by
  identity, and remembered as *long-lived*, so reading its attributes is guarded
  too and writing them is a located error.

A mutable buffer (a numpy array, a ``bytearray``) is guarded by value (its bytes),
since the items code reads from it are Python values at capture.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend.convert import is_user_file
from cuvil.frontend.proxy import TensorProxy
from cuvil.guards import (
    _SCALARS,
    MISSING,
    Place,
    ReadGuard,
    Same,
    buffer_key,
    contents_key,
    is_buffer,
    show,
    tensor_key,
)

#: a tensor the traced code may reach: (graph input name, getter, place or None)
LiftSource = tuple[str, Callable[[], Any], Place | None]

_CONTAINERS = (list, tuple, dict, set, frozenset)
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "update",
        "setdefault",
        "popitem",
        "add",
        "discard",
        "sort",
        "reverse",
        "__setitem__",
        "__delitem__",
        "__setattr__",
        "__delattr__",
    }
)


def global_place(globals_: dict[str, Any], name: str) -> Place | None:
    """The place of global ``name`` when ``globals_`` is an imported module's namespace."""
    modname = globals_.get("__name__")
    mod = sys.modules.get(modname) if isinstance(modname, str) else None
    if mod is None or getattr(mod, "__dict__", None) is not globals_:
        return None
    return ("global", modname, name)


def _sub(place: Place | None, name: str) -> Place | None:
    return None if place is None else ("attr", place, name)


def _library_module(value: Any) -> bool:
    return isinstance(value, types.ModuleType) and not is_user_file(getattr(value, "__file__", None) or "")


class Reads:
    """The read guards and the long-lived objects of one capture."""

    def __init__(self, lift_sources: dict[int, LiftSource]) -> None:
        self.guards: list[ReadGuard] = []
        self._seen: set[tuple[Any, ...]] = set()
        #: id -> (object, how user code names it, graph input name prefix, its place) of
        #: objects whose identity is guarded
        self.stable: dict[int, tuple[Any, str, str, Place | None]] = {}
        #: id of a closure cell of the root function -> its variable name
        self.root_cells: dict[int, str] = {}
        #: source files of the code the capture ran (converted or not): a cached variant
        #: is reused by another process only while these files are unchanged (cuvil/warm.py)
        self.files: set[str] = set()
        #: False when the capture did something a cached variant would not redo (a print)
        self.storable = True
        #: ids of the compiled module's submodules, whose submodule/parameter/buffer slots
        #: the module snapshot (cuvil/artifacts.py ModuleSnapshot) already checks on every call
        self.snapshotted: set[int] = set()
        #: module id -> the attribute names its unconverted code read while traced
        #: ([Note: recorded attribute reads] in cuvil/frontend/attribute_reads.py)
        self.attribute_reads: dict[int, set[str]] = {}
        self._lift_sources = lift_sources
        #: code of library functions whose settings are guarded -> the fewest calls deep seen
        self._library_seen: dict[types.CodeType, int] = {}

    def long_lived(
        self, obj: Any, path: str, input_name: str | None = None, place: Place | None = None
    ) -> None:
        """``obj`` (named ``path`` in user code) is the same object on every call that
        passes the guards: an argument guarded by identity, the compiled module, a read."""
        self.stable.setdefault(id(obj), (obj, path, input_name or path, place))

    def read(
        self,
        what: str,
        path: str,
        iname: str,
        getter: Callable[[], Any],
        value: Any,
        place: Place | None = None,
    ) -> None:
        """``value`` was read from the place ``what`` (named ``path`` in user code, ``iname``
        as a graph input); ``getter`` reads it again; ``place`` is how another process
        finds it ([Note: places])."""
        if isinstance(value, TensorProxy) or _library_module(value):
            return  # parameters and buffers (module snapshot), constant library modules
        # a builtin wrapped while captures run stands for itself (cuvil/frontend/builtin_args.py)
        if isinstance(value, types.FunctionType):
            value = value.__dict__.get("__cuvil_wrapped__", value)
        if (what, id(value)) in self._seen:
            return
        self._seen.add((what, id(value)))
        if isinstance(value, torch.Tensor):
            self._lift_sources.setdefault(id(value), (iname, getter, place))
            self._add(what, getter, "tensor", tensor_key(value), value, place)
        elif isinstance(value, _SCALARS) or value is MISSING:
            self._add(what, getter, "value", value, value, place)
        elif is_buffer(value):
            key = buffer_key(value)
            if key[0] == "no buffer":
                raise CompileError(
                    f"{what} is a {type(value).__name__} whose items cannot be compared by value "
                    f"(dtype {getattr(value, 'dtype', '?')}): what compiled code reads from it would "
                    "be frozen at capture",
                    None,
                    "pass it as an argument (torch.as_tensor(...)), or hold its values in a tensor",
                )
            self._add(what, getter, "buffer", key, value, place)
            self.long_lived(value, path, iname, place)
        elif type(value) in _CONTAINERS:
            self._add(what, getter, "contents", contents_key(value), value, place)
            self.long_lived(value, path, iname)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            if not isinstance(value, (set, frozenset)):
                for k, v in items:
                    if not isinstance(v, _SCALARS):
                        self.long_lived(v, f"{path}[{k!r}]", f"{iname}.{_key_name(k)}")
        elif isinstance(value, types.MethodType):
            self._add(what, getter, "method", (Same(value.__func__), Same(value.__self__)), value, place)
        elif isinstance(value, types.BuiltinMethodType) and not isinstance(
            getattr(value, "__self__", None), (types.ModuleType, type(None))
        ):
            return  # a method of a guarded object, e.g. ``lst.index``: a new object per read
        else:
            self._add(what, getter, "identity", value, value, place)
            self.long_lived(value, path, iname, place)

    def _add(
        self, what: str, getter: Callable[[], Any], kind: str, expected: Any, value: Any, place: Place | None
    ) -> None:
        self.guards.append(ReadGuard(what, getter, kind, expected, show(value), place))

    def guard_once(self, key: tuple[Any, ...], guard: ReadGuard) -> None:
        """Add ``guard`` unless a guard was added under ``key`` already (an environment
        variable or a torch setting read twice is one guard)."""
        if key not in self._seen:
            self._seen.add(key)
            self.guards.append(guard)

    # -- the reads converted code makes --------------------------------------------
    def glob(self, globals_: dict[str, Any], name: str, value: Any) -> None:
        if name in globals_:  # else a builtin: constant
            self.read(
                f"global '{name}'",
                name,
                f"global.{name}",
                functools.partial(globals_.get, name, MISSING),
                value,
                global_place(globals_, name),
            )

    def free(self, cell: types.CellType, name: str, value: Any) -> None:
        self.read(
            f"closure variable '{name}'",
            name,
            f"closure.{name}",
            functools.partial(getattr, cell, "cell_contents"),
            value,
            ("closure", name) if self.root_cells.get(id(cell)) == name else None,
        )

    def attr(self, obj: Any, name: str, value: Any, loc: SourceLoc | None) -> None:
        if _library_module(obj):
            self._library_attr(obj, name, value)
            return
        entry = self.stable.get(id(obj))
        if entry is None or entry[0] is not obj:
            return
        path, iname, owner_place = entry[1], entry[2], entry[3]
        if name in MUTATORS and isinstance(obj, (list, dict, set)):
            raise CompileError(
                f"`{path}.{name}(...)` changes a {type(obj).__name__} that lives outside the compiled function",
                loc,
                "Python side effects would run once, at compile time, not on every call; "
                "build a new value inside the function instead",
            )
        if id(obj) in self.snapshotted and (
            name in obj._modules or name in obj._parameters or name in obj._buffers
        ):
            return
        inst = getattr(obj, "__dict__", None)
        if isinstance(inst, dict) and name in inst and not isinstance(obj, type):
            getter: Callable[[], Any] = functools.partial(inst.get, name, MISSING)
        else:
            getter = functools.partial(getattr, obj, name)
        self.read(
            f"attribute '{path}.{name}'",
            f"{path}.{name}",
            f"{iname}.{name}",
            getter,
            value,
            _sub(owner_place, name),
        )

    def _library_attr(self, mod: types.ModuleType, name: str, value: Any) -> None:
        """``torch.relu``, ``np.pi``, ``somelib.SETTING``: a library module's attribute is
        guarded like a global of that module (by value, contents or identity), so a
        monkeypatched function or a setting computed from the environment is never
        frozen, in this process or another. Attributes a module makes up on access
        (``__getattr__``) are not in its namespace and stay constants."""
        namespace = getattr(mod, "__dict__", None)
        modname = getattr(mod, "__name__", None)
        if (
            not isinstance(namespace, dict)
            or not isinstance(modname, str)
            or namespace.get(name, MISSING) is not value
            or isinstance(value, types.ModuleType)  # a submodule: its own reads are guarded
        ):
            return
        self.read(
            f"attribute '{modname}.{name}'",
            f"{modname}.{name}",
            f"lib.{name}",
            functools.partial(namespace.get, name, MISSING),
            value,
            ("global", modname, name) if sys.modules.get(modname) is mod else None,
        )

    def store(self, obj: Any, kind: str, loc: SourceLoc | None) -> None:
        entry = self.stable.get(id(obj))
        if entry is None or entry[0] is not obj:
            return
        raise CompileError(
            f"writing an {kind} of `{entry[1]}`, which lives outside the compiled function",
            loc,
            "Python side effects would run once, at compile time, not on every call; "
            "return the value instead (or keep the state in a tensor argument)",
        )

    def add_file(self, code: Any) -> None:
        # a pseudo-file (``<string>``, a notebook cell) has no text to hash: the code
        # itself is compared, by its fingerprint, wherever a function is guarded
        if isinstance(code, types.CodeType) and not code.co_filename.startswith("<"):
            self.files.add(code.co_filename)

    # -- the state of the modules the capture ran ------------------------------------
    def module_states(self) -> None:
        """One ``"state"`` guard per module that is long-lived here (the compiled module's
        tree, modules read from globals, attributes, containers) and its submodules, and
        one per global hook dictionary ([Note: module state guards] in
        :mod:`cuvil.frontend.object_state`). Called once, after the trace."""
        from cuvil.frontend.object_state import FORWARD_HOOKS, GLOBAL_HOOKS, StateView, same

        found: dict[int, tuple[torch.nn.Module, str, Place | None]] = {
            id(obj): (obj, path, place)
            for obj, path, _, place in self.stable.values()
            if isinstance(obj, torch.nn.Module)
        }
        for obj, path, place in list(found.values()):
            for sub_path, sub in obj.named_modules():
                sub_place = place
                for part in sub_path.split(".") if sub_path else ():
                    sub_place = _sub(sub_place, part)
                found.setdefault(id(sub), (sub, f"{path}.{sub_path}" if sub_path else path, sub_place))
        if not found:
            return
        for sub, path, place in found.values():
            recorded = self.attribute_reads.get(id(sub))
            view = StateView(
                sub,
                snapshotted=id(sub) in self.snapshotted,
                reads=frozenset(recorded) if recorded is not None else None,
            )
            self._add(
                f"state of module '{path}' ({type(sub).__name__})",
                functools.partial(same, sub),
                "state",
                view,
                sub,
                place,
            )
        # hooks run as they are (torch calls them): guard what their code reads, as for
        # any function without source (a hook scaling by a global)
        hook_dicts = [getattr(sub, n, None) for sub, _, _ in found.values() for n in FORWARD_HOOKS]
        hook_dicts += [getattr(torch.nn.modules.module, n, None) for n in GLOBAL_HOOKS]
        for hooks in hook_dicts:
            if isinstance(hooks, dict):
                for hook in list(hooks.values()):
                    self.code(hook)
        namespace = torch.nn.modules.module
        for name in GLOBAL_HOOKS:
            hooks = getattr(namespace, name, None)
            if isinstance(hooks, dict):
                self._add(
                    f"torch's {name.lstrip('_').replace('_', ' ')}",
                    functools.partial(getattr, namespace, name),
                    "state",
                    StateView(hooks),
                    hooks,
                    ("global", namespace.__name__, name),
                )

    # -- functions that are not converted -----------------------------------------
    def code(self, fn: Any) -> None:
        """Guard everything ``fn`` may read from outside (a lambda, code without source):
        each global its code names and each closure cell."""
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType) or not isinstance(fn, types.FunctionType):
            return
        self.add_file(code)
        globals_ = fn.__globals__
        for name in sorted(_names(code)):
            if name in globals_:
                self.glob(globals_, name, globals_[name])
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            self.free(cell, name, value)

    def library_code(self, fn: Any, depth: int = 0) -> None:
        """A library Python function the trace runs as is (``somelib.scale(x)``): the
        plain settings of its module that its code names (``SCALE = float(os.environ
        ...)``) are guarded by value, so a setting that differs by environment is not
        reused by a warm start; so are those of the library's functions it names, to
        :data:`LIBRARY_DEPTH` calls deep (``scale`` calling ``_impl`` reading ``FACTOR``).
        Their source files count like user code's (cuvil/warm.py). What library code
        reaches through objects (a registry dict, a setting behind a getter) is the
        installed library's behaviour."""
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType) or not isinstance(fn, types.FunctionType):
            return
        if self._library_seen.get(code, LIBRARY_DEPTH + 1) <= depth:
            return
        self._library_seen[code] = depth
        globals_ = fn.__globals__
        package = str(globals_.get("__name__", "")).partition(".")[0]
        if package != "torch":  # torch's own files: keyed by its version
            self.add_file(code)
        for name in sorted(_names(code)):
            value = globals_.get(name, MISSING)
            if value is MISSING or (name.startswith("__") and name.endswith("__")):
                continue  # a dunder (``__name__``): fixed with the module
            if isinstance(value, _SCALARS):
                self.glob(globals_, name, value)
            elif (
                depth < LIBRARY_DEPTH
                and isinstance(value, types.FunctionType)
                and str(value.__globals__.get("__name__", "")).partition(".")[0] == package
            ):
                self.library_code(value, depth + 1)


#: how many calls deep the settings read by library functions run as they are are guarded
LIBRARY_DEPTH = 3


def _key_name(key: Any) -> str:
    text = str(key)
    return text if text.isidentifier() or text.isdigit() else "item"


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


__all__ = ["MUTATORS", "LiftSource", "Reads", "global_place"]
