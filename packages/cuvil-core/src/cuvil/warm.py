"""The cache of captured variants: a warm start without capture.

A compiled function's first call in a fresh process used to capture again even
when the on-disk caches held its program and kernels: capture needs torch's
``ShapeEnv`` (importing it costs ~0.7 s) and runs the user's code on proxies.
When every read a capture made can be found again by another process (each
guard has a *place*, [Note: places] in :mod:`cuvil.guards`), the variant is
stored in the ``calls`` store of the cache root (signed entries,
:class:`cuvil_runtime.cache.DiskCache`): the graph (plain data), the call plan
(:mod:`cuvil.call_plan`), the guards as (place, kind, expected value), and the
sha256 of every source file the capture ran.

A later process looks the variant up before capturing, by a key of everything
the variant was compiled from that a process can compute without capturing:
the function's module, qualified name and file (a module's class, and each
submodule's class, training flag and parameter names, dtypes and shapes), the
structure key (argument tree, dtypes, devices, ranks, Python values), the
target, its hash and options, ``dynamic`` and ``dims``, torch's version and
the compiler's own code. A hit is used only when

* every recorded source file still has its sha256 (an edited file recaptures),
* every guard's place resolves and holds what capture saw: scalars and
  containers of scalars by value, tensors by dtype/device/shape, functions without
  a closure by module, qualified name, code location and defaults, classes and modules by name,
  other objects by class (their attributes are read, and guarded, one by one).

The guards are then rebuilt as in-process guards of the objects found (identity
from here on), exactly as a capture in this process would have made them. A
variant with a read that has no place (an object argument, a helper's closure
cell, a bound method, a tensor met only by identity) is not stored: it is
captured in every process, as before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil.call_plan import (
    VALUE_TYPES,
    PlanError,
    decode_check,
    decode_outputs,
    decode_spec,
    dtype_name,
    dtype_of,
    encode_call,
    leaf_json,
    state_slot,
)
from cuvil.errors import CompileError
from cuvil.frontend import impure, object_state
from cuvil.frontend.object_state import fingerprint
from cuvil.guards import MISSING, Place, ReadGuard, ReadGuards, contents_key, show, tensor_key

#: bumped when an entry's layout changes (old entries then miss)
VERSION = 1
#: variants kept per key (the newest)
MAX_VARIANTS = 8
#: ``CUVIL_WARM=0`` turns the cache of captured variants off (every process captures)
ENV = "CUVIL_WARM"


NotStorable = object_state.NotStorable


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


@functools.cache
def _compiler_code() -> str:
    import cuvil_ir
    import cuvil_runtime
    from cuvil_runtime.pipeline import package_hash

    # this package by its entry in sys.modules: importing it here would be a cycle
    return package_hash(sys.modules[__name__.partition(".")[0]], cuvil_ir, cuvil_runtime)


def _store() -> Any:
    from cuvil_runtime.cache import DiskCache, default_cache_dir

    return DiskCache(default_cache_dir() / "calls")


# -- the key ------------------------------------------------------------------------------


def _code_of(obj: Any) -> Any:
    return getattr(getattr(obj, "__func__", obj), "__code__", None)


def _identity(fn: Any, module: torch.nn.Module | None) -> list[Any]:
    if module is not None:
        out = []
        for path, sub in module.named_modules():
            cls = type(sub)
            code = _code_of(cls.forward)
            where = fingerprint(code) if isinstance(code, types.CodeType) else None
            out.append([path, cls.__module__, cls.__qualname__, where, sub.training])
        return out
    code = _code_of(fn)
    if not isinstance(code, types.CodeType) or isinstance(fn, functools.partial):
        raise NotStorable("not a plain function")
    return [getattr(fn, "__module__", None), fn.__qualname__, fingerprint(code)]


def key(cf: Any, structure: tuple[Any, ...], target: Any, options: Any, amp: Any = ()) -> str | None:
    """The variant's key in the ``calls`` store, or ``None`` when it cannot have one."""
    try:
        spec_text = pytree.treespec_dumps(structure[0])
        leaves = [leaf_json(k, str(i)) for i, k in enumerate(structure[1])]
        ident = _identity(cf.fn, cf.module)
    except (CompileError, NotStorable, TypeError, ValueError, NotImplementedError):
        return None
    state = []
    if cf.module is not None:
        from cuvil.frontend.capture import module_state

        state = [[n, dtype_name(o[k].dtype), list(o[k].shape)] for n, o, k in module_state(cf.module)]
    parts = [
        f"cuvil warm v{VERSION}",
        _compiler_code(),
        torch.__version__,
        target.name,
        target.hash(),
        repr(options),
        cf.dynamic,
        sorted((k, sorted(v.items())) for k, v in cf.dims.items()),
        spec_text,
        leaves,
        ident,
        state,
        [[d, str(t)] for d, t in amp],  # the call's autocast: its casts are in the graph
    ]
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()


# -- values and places ----------------------------------------------------------------------


def _scalar(value: Any) -> dict[str, Any]:
    if value is MISSING:
        return {"t": "missing"}
    if isinstance(value, torch.dtype):
        return {"t": "dtype", "v": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"t": "device", "v": str(value)}
    name = type(value).__name__
    if name in VALUE_TYPES and type(value) is VALUE_TYPES[name]:
        return {"t": name, "v": value}
    raise NotStorable(f"a {type(value).__name__} value cannot be compared in another process")


def _from_scalar(d: dict[str, Any]) -> Any:
    t = d["t"]
    if t == "missing":
        return MISSING
    if t == "dtype":
        return dtype_of(d["v"])
    if t == "device":
        return torch.device(d["v"])
    return VALUE_TYPES[t](d["v"])


def _container(value: Any, depth: int = 0) -> Any:
    if type(value) in (list, tuple) and depth < 4:
        return {"t": type(value).__name__, "items": [_container(v, depth + 1) for v in value]}
    if type(value) is dict and depth < 4:
        return {"t": "dict", "items": [[_scalar(k), _container(v, depth + 1)] for k, v in value.items()]}
    if type(value) in (set, frozenset) and depth < 4:
        items = sorted((_container(v, depth + 1) for v in value), key=json.dumps)
        return {"t": type(value).__name__, "items": items}
    return _scalar(value)


def _same_container(value: Any, d: Any) -> bool:
    try:
        return bool(_container(value) == d)
    except NotStorable:
        return False


def _describe(value: Any) -> dict[str, Any]:
    """What an identity-guarded object must be in another process."""
    if isinstance(value, types.ModuleType):
        return {"t": "module", "name": value.__name__}
    if isinstance(value, type):
        return {"t": "class", "module": value.__module__, "qualname": value.__qualname__}
    if isinstance(value, types.FunctionType):
        # a closure's cells, like an object's state, are seen by no read guard when the
        # function runs unconverted: only a function without one is matched by its name
        if value.__closure__:
            raise NotStorable(f"{value.__qualname__} is a closure")
        code = value.__code__
        return {
            "t": "function",
            "module": value.__module__,
            "qualname": value.__qualname__,
            "file": code.co_filename,
            "line": code.co_firstlineno,
            # what it does, not only where: two lambdas on one line, an edited helper
            "code": fingerprint(code),
            # defaults are values of the defining process (``k=float(os.environ["K"])``)
            "defaults": _container(value.__defaults__ or ()),
            "kwdefaults": _container(value.__kwdefaults__ or {}),
        }
    if isinstance(value, types.BuiltinFunctionType):
        return {"t": "builtin", "module": getattr(value, "__module__", None), "qualname": value.__qualname__}
    cls = type(value)
    if _user_class(cls):
        # its methods run converted and its attributes are read (and guarded) one by one;
        # an object of a library class may hold state no read guard sees (a partial's
        # arguments, a library module's flags), so it is never matched by class
        return {"t": "instance", "module": cls.__module__, "qualname": cls.__qualname__}
    raise NotStorable(
        f"a {cls.__name__} object (a library class) is compared by identity, which another process cannot prove"
    )


#: special methods a class matched by class alone may define: none that Python calls
#: natively on the object during a capture (``len(obj)``, ``obj[i]``, iteration, ``bool``),
#: whose reads of the object's state no guard would see
_PLAIN_DUNDERS = frozenset(
    {"__init__", "__post_init__", "__repr__", "__str__", "__eq__", "__hash__", "__init_subclass__"}
)


def _user_class(cls: type) -> bool:
    """A user-defined class whose behaviour during capture is its attributes (read and
    guarded one by one) and its methods (converted when called): its own classes define
    no other special methods, and its only library bases are ``object`` and ``nn.Module``."""
    from cuvil.frontend.convert import is_user_file

    for base in cls.__mro__:
        if base in (object, torch.nn.Module):
            continue
        mod = sys.modules.get(base.__module__)
        if not is_user_file(getattr(mod, "__file__", None) or ""):
            return False
        for name, attr in vars(base).items():
            if (
                name.startswith("__")
                and name.endswith("__")
                and callable(attr)
                and name not in _PLAIN_DUNDERS
            ):
                return False
    return True


def _guarded(g: ReadGuard, encode: Any, value: Any) -> Any:
    try:
        return encode(value)
    except NotStorable as e:
        raise NotStorable(f"{g.what}: {e}") from None


def _encode_guard(g: ReadGuard, value: Any) -> dict[str, Any]:
    if g.place is None:
        raise NotStorable(f"{g.what} has no place another process can find")
    if g.kind == "method":
        raise NotStorable(f"{g.what} is a bound method, compared by identity")
    if g.kind == "value":
        expected: Any = _guarded(g, _scalar, value)
    elif g.kind == "contents":
        expected = _guarded(g, _container, value)
    elif g.kind == "tensor":
        if not isinstance(value, torch.Tensor):
            raise NotStorable(f"{g.what} is no longer a tensor")
        expected = [dtype_name(value.dtype), str(value.device), list(value.shape)]
    elif g.kind == "state":
        try:
            expected = object_state.state_json(value, getattr(g.expected, "reads", None))
        except NotStorable as e:
            raise NotStorable(f"{g.what}: {e}") from None
    else:
        expected = _guarded(g, _describe, value)
    return {"what": g.what, "place": _place_json(g.place), "kind": g.kind, "expected": expected}


def _place_json(place: Place) -> Any:
    if place[0] == "attr":
        return ["attr", _place_json(place[1]), place[2]]
    return list(place)


def _place_tuple(data: Any) -> Place:
    if data[0] == "attr":
        return ("attr", _place_tuple(data[1]), str(data[2]))
    return tuple(data)


class _Resolver:
    """Finds places in this process: the compiled function's globals, closure, module."""

    def __init__(self, fn: Any, module: torch.nn.Module | None) -> None:
        self.fn = getattr(fn, "__func__", fn)
        self.module = module

    def getter(self, place: Place) -> Any:
        """A function that reads ``place`` now (raises NotStorable when it cannot be found)."""
        kind = place[0]
        if kind == "global":
            mod = sys.modules.get(place[1])
            if mod is None:
                raise NotStorable(f"module {place[1]} is not imported")
            return functools.partial(mod.__dict__.get, place[2], MISSING)
        if kind == "closure":
            code = _code_of(self.fn)
            cells = dict(zip(code.co_freevars, self.fn.__closure__ or ())) if code is not None else {}
            if place[1] not in cells:
                raise NotStorable(f"no closure variable {place[1]}")
            return functools.partial(getattr, cells[place[1]], "cell_contents")
        if kind == "environ":  # an environment variable (cuvil/frontend/impure.py)
            return functools.partial(os.environ.get, place[1], MISSING)
        if kind == "query":  # a torch setting read by a call (cuvil/frontend/impure.py)
            read = impure.query_getter(place)
            if read is None:
                raise NotStorable(f"no query {place[1]}.{place[2]}")
            return read
        if kind == "root":  # the compiled function itself
            fn = self.fn
            return lambda: fn
        if kind == "self":
            if self.module is None:
                raise NotStorable("no module")
            sub = self.module.get_submodule(place[1]) if place[1] else self.module
            return lambda: sub
        if kind == "attr":
            owner = self.getter(place[1])()
            name = place[2]
            inst = getattr(owner, "__dict__", None)
            if isinstance(inst, dict) and name in inst and not isinstance(owner, type):
                return functools.partial(inst.get, name, MISSING)
            return functools.partial(getattr, owner, name)
        raise NotStorable(f"unknown place {kind}")


def _holds(kind: str, expected: Any, value: Any, place: Place) -> tuple[Any, bool]:
    """The in-process guard's expected value for ``value``, and whether ``value`` is what
    the stored guard expects."""
    if kind == "value":
        try:
            want = _from_scalar(expected)
        except (KeyError, TypeError, ValueError, PlanError):
            return None, False
        return value, value is want or (type(value) is type(want) and value == want)
    if kind == "contents":
        return contents_key(value), _same_container(value, expected)
    if kind == "state":
        # the names the storing capture recorded its code reading ([Note: recorded attribute reads])
        reads = frozenset(expected["reads"]) if isinstance(expected, dict) and "reads" in expected else None
        try:
            ok = object_state.state_json(value, reads) == expected
        except NotStorable:
            return None, False
        return object_state.StateView(value, snapshotted=place[0] == "self", reads=reads), ok
    if kind == "tensor":
        ok = (
            isinstance(value, torch.Tensor)
            and [dtype_name(value.dtype), str(value.device), list(value.shape)] == expected
        )
        return tensor_key(value), ok
    try:
        return value, _describe(value) == expected
    except NotStorable:
        return value, False


# -- store and lookup ----------------------------------------------------------------------


def store(cf: Any, entry_key: str, c: Any, leaves: list[Any], structure: tuple[Any, ...]) -> str | None:
    """Write the variant ``c`` under ``entry_key`` when every read has a place and a
    value another process can compare; returns None when written, else why not (the
    caller puts it in ``stats.notes``). Never raises: a variant that cannot be stored is
    only captured again by the next process."""
    try:
        return _store_entry(cf, entry_key, c, leaves, structure)
    except Exception as e:  # a bug here must not fail a compile that worked
        return f"internal error: {type(e).__name__}: {e}"


def _store_entry(
    cf: Any, entry_key: str, c: Any, leaves: list[Any], structure: tuple[Any, ...]
) -> str | None:
    if not c.storable:
        return "the capture ran a Python side effect (a print) that a warm start would not redo"
    try:
        guards = [_encode_guard(g, g.current()) for g in c.guards.guards]
        # a pseudo-file (``<string>``, a notebook cell) has no text to hash; a function
        # from one is still matched by its code's fingerprint (``_describe``)
        files_needed = set(c.files) | {
            g["expected"]["file"]
            for g in guards
            if isinstance(g["expected"], dict)
            and g["expected"].get("t") == "function"
            and not str(g["expected"]["file"]).startswith("<")
        }
        inputs: list[dict[str, Any]] = []
        names = [v.name for v in c.graph.inputs]
        lifted = iter(c.lifted)
        for j, (kind, where) in enumerate(c.inputs):
            if kind == "leaf":
                inputs.append({"kind": "leaf", "leaf": where})
            elif kind == "state":
                inputs.append({"kind": "parameter", "name": names[j].removeprefix("self.")})
            else:
                lf = next(lifted)
                if lf.place is None:
                    raise NotStorable(f"tensor {lf.name} has no place another process can find")
                inputs.append({"kind": "lifted", "name": lf.name, "place": _place_json(lf.place)})
        bargs, bkwargs = pytree.tree_unflatten(leaves, structure[0])
        call = encode_call(cf, c, structure, bargs, bkwargs)
        call["inputs"] = inputs
        files = {f: _file_hash(f) for f in sorted(files_needed)}
        unreadable = sorted(f for f, h in files.items() if h is None)
        if unreadable:
            raise NotStorable(f"source file {unreadable[0]} cannot be read")
    except (NotStorable, CompileError, StopIteration, TypeError, ValueError) as e:
        return str(e) or type(e).__name__
    from cuvil_ir.serial import Codec, SerialError

    try:
        graph = Codec().dumps(c.graph).decode()
    except SerialError as e:
        return f"the graph cannot be serialized: {e}"
    variant = {"graph": graph, "call": call, "guards": guards, "files": files}
    # One key, several variants: the same structure compiled for sizes that other size
    # assumptions hold for (x[-3:] of 2 rows clamps, of 5 rows does not), or for other
    # guarded values. Newest first; a variant stored again replaces itself. Two processes
    # storing at once may lose one variant: it is only captured again.
    store = _store()
    variants = [v for v in _variants(store.get(entry_key)) if v != variant]
    entry = {"version": VERSION, "variants": [variant, *variants][:MAX_VARIANTS]}
    try:
        store.put(entry_key, json.dumps(entry, sort_keys=True).encode())
    except OSError as e:
        return f"the cache could not be written: {e}"
    return None


def _variants(blob: bytes | None) -> list[dict[str, Any]]:
    if blob is None:
        return []
    try:
        entry = json.loads(blob)
    except ValueError:
        return []
    if not isinstance(entry, dict) or entry.get("version") != VERSION:
        return []
    variants = entry.get("variants")
    return [v for v in variants if isinstance(v, dict)] if isinstance(variants, list) else []


_hashes: dict[tuple[str, int, int], str] = {}


def _file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    k = (path, st.st_mtime_ns, st.st_size)
    h = _hashes.get(k)
    if h is None:
        try:
            h = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return None
        _hashes[k] = h
    return h


def lookup(cf: Any, entry_key: str, leaves: list[Any]) -> Any:
    """The newest stored variant that serves this call (its files unchanged, its guards
    and its size assumptions holding for ``leaves``) as a
    :class:`~cuvil.frontend.capture.Captured`, or ``None``."""
    for variant in _variants(_store().get(entry_key)):
        c = _use(cf, variant)
        if c is not None and c.check.holds(leaves):
            return c
    return None


def _use(cf: Any, entry: dict[str, Any]) -> Any:
    try:
        for f, h in entry["files"].items():
            if _file_hash(f) != h:
                return None
        resolver = _Resolver(cf.fn, cf.module)
        guards = []
        for g in entry["guards"]:
            place = _place_tuple(g["place"])
            getter = resolver.getter(place)
            try:
                value = getter()
            except Exception:
                value = MISSING
            expected, ok = _holds(g["kind"], g["expected"], value, place)
            if not ok:
                return None
            guards.append(ReadGuard(g["what"], getter, g["kind"], expected, show(value), place))
        return _captured(cf, entry, resolver, ReadGuards(guards))
    except Exception:  # an entry this code cannot use: capture as if there were none
        return None


def _captured(cf: Any, entry: dict[str, Any], resolver: _Resolver, guards: ReadGuards) -> Any:
    from cuvil.frontend.capture import Captured
    from cuvil.frontend.tracer import Lifted
    from cuvil_ir.serial import Codec

    graph = Codec().loads(entry["graph"].encode())
    call = entry["call"]
    plan: list[tuple[str, Any]] = []
    lifted = []
    for j, inp in enumerate(call["inputs"]):
        if inp["kind"] == "leaf":
            plan.append(("leaf", int(inp["leaf"])))
        elif inp["kind"] == "parameter":
            if cf.module is None:
                raise NotStorable("no module")
            plan.append(("state", state_slot(cf.module, inp["name"], Path(cf.__qualname__))))
        else:
            place = _place_tuple(inp["place"])
            getter = resolver.getter(place)
            lifted.append(Lifted(graph.inputs[j], str(inp["name"]), getter, place))
            plan.append(("lifted", getter))
    return Captured(
        graph,
        plan,
        decode_check(call, graph),
        decode_spec(call["result"]),
        decode_outputs(call),
        lifted,
        guards,
        frozenset(entry["files"]),
    )


__all__ = ["ENV", "enabled", "key", "lookup", "store"]
