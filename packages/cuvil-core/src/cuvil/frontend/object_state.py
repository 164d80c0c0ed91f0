"""The state of the modules a capture ran, guarded whole.

[Note: module state guards]
Converted code reads long-lived values through the read hooks, one guard per read
(:mod:`cuvil.frontend.reads`). A module whose ``forward`` runs as it is -- every
``torch.nn`` module, every module of a library such as transformers, a user
module with hooks -- reads its attributes where no hook sees them:
``LeakyReLU.negative_slope``, ``LayerNorm.eps``, ``Softmax.dim``, a config object's
``layer_norm_eps``. And ``Module.__call__`` reads the forward hook dictionaries of
every module, converted or not, and torch's global hook dictionaries.

So each such object gets one guard of kind ``"state"`` over everything it holds:

- a module whose forward runs as it is: its whole ``__dict__`` except the slots
  the module snapshot already checks (parameters, buffers, submodules, by
  identity) and the hooks that do not run in inference (backward, state-dict);
  values nested in it (lists, dicts, sets, plain objects such as a config, to
  :data:`DEPTH` levels) are walked the same way;
- a module whose forward is converted: its forward hook dictionaries only (its
  attribute reads are guarded one by one);
- torch's global forward hook dictionaries, once per capture that ran a module.

In a process, :class:`StateView` compares each walked namespace with a copy
taken after the capture: Python values (numbers, strings, tuples, dtypes) by
equality, anything else (tensors, functions, objects) by identity, so one C-level
comparison per namespace decides a hit. Across processes (cuvil/warm.py),
:func:`state_json` encodes the same state as plain data: values by value,
functions by their code's fingerprint, objects by class and state; a value it
cannot encode (a tensor attribute, a closure) raises ``NotStorable``, and the
variant is then captured in every process.
"""

from __future__ import annotations

import enum
import functools
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from cuvil.frontend.attribute_reads import WHOLE

#: how deep nested containers and objects are walked
DEPTH = 4

#: module slots the module snapshot checks (cuvil/artifacts.py ModuleSnapshot) or that no inference call reads
SKIPPED = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)

#: the hook slots ``Module.__call__`` reads on the way to ``forward``
FORWARD_HOOKS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)

#: torch's global hook dictionaries ``Module.__call__`` reads
GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
    "_global_forward_pre_hooks",
)

#: values compared by equality; everything else by identity (and walked when mutable)
_EQUAL = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)


class NotStorable(Exception):
    """A value another process could not find or compare."""


def _plain(v: Any) -> bool:
    if isinstance(v, _EQUAL):
        return True
    return isinstance(v, (tuple, frozenset)) and all(_plain(x) for x in v)


def _has_state(v: Any) -> bool:
    """A plain object whose attributes a library's code may read."""
    if isinstance(
        v, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, torch.nn.Module)
    ):
        return False
    if isinstance(v, (torch.Tensor, types.MethodType, functools.partial)):
        return False
    if getattr(type(v), "__cuvil_bookkeeping__", False):
        # a compiled function stored on a module (``model.forward = cu.compile(...)``): its
        # artifacts and stats change with every compile and are no program state
        return False
    return isinstance(getattr(v, "__dict__", None), dict)


class _Namespace:
    """One mapping's entries at snapshot time: Python values by equality, others by identity."""

    __slots__ = ("absent", "d", "eq", "eq_values", "ids", "keys", "label", "n", "names")

    def __init__(
        self, d: dict[Any, Any], keys: list[Any], label: str, absent: frozenset[str] | None = None
    ) -> None:
        """``absent``: compare only ``keys`` and that these names stay absent (a module
        whose reads were recorded: [Note: recorded attribute reads]); ``None``: the
        whole mapping (its size too: an added entry is a change)."""
        self.d = d
        self.keys = tuple(keys)
        self.label = label
        self.n = len(d)
        self.names = frozenset(d) if absent is None else frozenset()
        self.absent = absent
        eq = [k for k in keys if _plain(d[k])]
        self.ids = tuple((k, d[k]) for k in keys if not _plain(d[k]))
        # itemgetter returns a bare value for one key: pad with a key seen twice
        self.eq = operator.itemgetter(*eq, *eq[:1]) if eq else None
        self.eq_values = self.eq(d) if self.eq is not None else None

    def holds(self) -> bool:
        d = self.d
        if self.absent is None:
            if len(d) != self.n:
                return False
        elif not d.keys().isdisjoint(self.absent):
            return False
        for k, v in self.ids:
            if d.get(k, _MISSING) is not v:
                return False
        if self.eq is None:
            return True
        try:
            return bool(self.eq(d) == self.eq_values)
        except Exception:  # a key deleted and another added
            return False

    def changed(self) -> str:
        """The first entry that differs, for a recompile reason."""
        d = self.d
        before = dict(self.ids)
        if self.eq is not None:
            keys = self.eq.__reduce__()[1]
            before.update(zip(keys, self.eq_values))
        for k, v in before.items():
            cur = d.get(k, _MISSING)
            if cur is not v and not (_plain(v) and _plain(cur) and cur == v):
                now = "(deleted)" if cur is _MISSING else _short(cur)
                return f"{self.label}{k}: {_short(v)} -> {now}"
        added = (
            sorted(d.keys() & self.absent)
            if self.absent is not None
            else [k for k in d if k not in self.names]
        )
        return f"{self.label}{added[0]!r} added" if added else f"{self.label}an entry changed"


class _Sequence:
    __slots__ = ("items", "seq")

    def __init__(self, seq: Any) -> None:
        self.seq = seq
        self.items = tuple(seq)

    def holds(self) -> bool:
        items = self.items
        cur = tuple(self.seq)
        return len(cur) == len(items) and all(a is b or (_plain(a) and a == b) for a, b in zip(cur, items))

    def changed(self) -> str:
        return f"a {type(self.seq).__name__} changed: {_short(self.items)} -> {_short(tuple(self.seq))}"


def _short(v: Any) -> str:
    if isinstance(v, dict):  # a hook dictionary
        return f"{len(v)} entries"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


_MISSING = object()


class StateView:
    """The in-process guard of one object's state ([Note: module state guards])."""

    __slots__ = ("obj", "parts", "reads")

    def __init__(self, obj: Any, snapshotted: bool = True, reads: frozenset[str] | None = None) -> None:
        """``snapshotted``: a module of the compiled module's tree, whose parameter,
        buffer and submodule slots the module snapshot checks (else they are compared
        here, by identity). ``reads``: the attribute names the capture recorded its code
        reading ([Note: recorded attribute reads]); ``None``: its whole state."""
        self.obj = obj
        self.reads = reads
        self.parts: list[Any] = []
        seen: set[int] = set()
        if isinstance(obj, torch.nn.Module):
            d = obj.__dict__
            keys = module_keys(obj, reads)
            if not snapshotted:
                keys += [k for k in ("_parameters", "_buffers", "_modules") if k in d and k not in keys]
            self._namespace(d, keys, 0, seen, "", absent_names(obj, reads))
        else:
            self._walk(obj, 0, seen, "")

    def _namespace(
        self,
        d: dict[Any, Any],
        keys: list[Any],
        depth: int,
        seen: set[int],
        label: str,
        absent: frozenset[str] | None = None,
    ) -> None:
        self.parts.append(_Namespace(d, keys, label, absent))
        for k in keys:
            self._walk(d[k], depth + 1, seen, f"{label}{k}.")

    def _walk(self, v: Any, depth: int, seen: set[int], label: str) -> None:
        if depth > DEPTH or id(v) in seen or _plain(v):
            return
        if isinstance(v, dict):
            seen.add(id(v))
            self._namespace(v, list(v), depth, seen, label)
        elif isinstance(v, (list, set, tuple, frozenset)):
            seen.add(id(v))
            if not isinstance(v, (tuple, frozenset)):
                self.parts.append(_Sequence(v))
            for i, x in enumerate(v):
                self._walk(x, depth + 1, seen, f"{label}{i}.")
        elif _has_state(v):
            seen.add(id(v))
            d = vars(v)
            self._namespace(d, list(d), depth, seen, label)

    def holds(self, cur: Any) -> bool:
        if cur is not self.obj:
            return False
        for p in self.parts:
            if not p.holds():
                return False
        return True

    def changed(self, cur: Any) -> str:
        if cur is not self.obj:
            return "another object"
        for p in self.parts:
            if not p.holds():
                return p.changed()
        return "unchanged"


def same(obj: Any) -> Any:
    """The getter of an object held for the whole process (``functools.partial(same, m)``)."""
    return obj


def fast_check(guards: list[tuple[Callable[[], Any], StateView]]) -> Callable[[], bool]:
    """One function that is True when every ``(getter, view)`` still reads the same
    object and every walked namespace and sequence holds *the very same* values, as
    one generated expression: per namespace one tuple comparison of its Python values
    and a C-level ``map(is_, ...)`` over its objects, ``not d`` for the empty hook
    dictionaries most modules have. False means "compare exactly"
    (:meth:`StateView.holds`), which explains nothing away: the two agree on every
    state, the fast one is only quicker where nothing changed. [Note: module state guards]"""
    env: dict[str, Any] = {"is_": operator.is_, "all": all, "map": map, "len": len, "tuple": tuple}
    terms: list[str] = []
    for i, (getter, view) in enumerate(guards):
        if not (isinstance(getter, functools.partial) and getter.func is same and getter.args == (view.obj,)):
            env[f"g{i}"], env[f"o{i}"] = getter, view.obj
            terms.append(f"g{i}() is o{i}")
        for j, part in enumerate(view.parts):
            name = f"p{i}_{j}"
            if isinstance(part, _Namespace):
                d = part.d
                env[name] = d
                if not d:
                    terms.append(f"not {name}")
                    continue
                if part.absent is None:
                    terms.append(f"len({name}) == {len(d)}")
                elif part.absent:
                    env[f"{name}a"] = part.absent
                    terms.append(f"{name}.keys().isdisjoint({name}a)")
                plain = [k for k in part.keys if _plain(d[k])]
                objects = [k for k in part.keys if not _plain(d[k])]
                if plain:  # one C-level tuple comparison (padded: itemgetter of one key is no tuple)
                    env[f"{name}p"] = operator.itemgetter(*plain, plain[0])
                    env[f"{name}pv"] = tuple(d[k] for k in [*plain, plain[0]])
                    terms.append(f"{name}p({name}) == {name}pv")
                if objects:
                    env[f"{name}o"] = operator.itemgetter(*objects, objects[0])
                    env[f"{name}ov"] = tuple(d[k] for k in [*objects, objects[0]])
                    terms.append(f"all(map(is_, {name}o({name}), {name}ov))")
            else:
                env[name] = part.seq
                if not part.items:
                    terms.append(f"not {name}")
                    continue
                env[f"{name}v"] = part.items
                terms.append(f"len({name}) == {len(part.items)} and all(map(is_, tuple({name}), {name}v))")
    body = " and ".join(terms) or "True"
    source = f"def state_unchanged():\n    try:\n        return bool({body})\n    except Exception:\n        return False\n"
    exec(compile(source, "<cuvil state guards>", "exec"), env)  # noqa: S102 -- our own text
    return env["state_unchanged"]  # type: ignore[no-any-return]


def module_keys(m: torch.nn.Module, reads: frozenset[str] | None = None) -> list[str]:
    """The slots of ``m.__dict__`` a state guard compares: with ``reads`` (the names its
    code was recorded reading, [Note: recorded attribute reads]) those and the forward
    hooks, else all."""
    d = m.__dict__
    if runs_unconverted(m):
        if reads is None or WHOLE in reads:
            return [k for k in d if k not in SKIPPED]
        return [k for k in d if (k in reads or k in FORWARD_HOOKS) and k not in SKIPPED]
    return [k for k in FORWARD_HOOKS if k in d]


def absent_names(m: torch.nn.Module, reads: frozenset[str] | None) -> frozenset[str] | None:
    """The names read that ``m.__dict__`` lacks (they must stay absent), or ``None``
    when the whole dict is compared."""
    if reads is None or WHOLE in reads or not runs_unconverted(m):
        return None
    d = m.__dict__
    return frozenset(k for k in reads if k not in d)


def has_hooks(m: torch.nn.Module) -> bool:
    """Whether calling ``m`` runs a forward hook (its own or torch's global ones)."""
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or getattr(m, "_forward_hooks_with_kwargs", None)
        or torch.nn.modules.module._global_forward_hooks
        or torch.nn.modules.module._global_forward_pre_hooks
    )


def runs_unconverted(m: torch.nn.Module) -> bool:
    """Whether capture runs ``m.forward`` as it is (its reads of ``m`` unseen)."""
    from cuvil.frontend.convert import is_user_function

    return has_hooks(m) or not is_user_function(type(m).forward)


# -- across processes ---------------------------------------------------------------------


def fingerprint(code: types.CodeType) -> str:
    """A digest of what a code object does: two lambdas on one line differ here."""
    import hashlib

    h = hashlib.sha256()

    def feed(c: types.CodeType) -> None:
        for part in (c.co_qualname, c.co_filename, str(c.co_firstlineno), c.co_code.hex()):
            h.update(part.encode() + b"\0")
        for names in (c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars):
            h.update(repr(names).encode() + b"\0")
        h.update(repr((c.co_argcount, c.co_kwonlyargcount, c.co_posonlyargcount, c.co_flags)).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                feed(const)
            else:
                h.update(f"{type(const).__name__}:{const!r}".encode() + b"\0")

    feed(code)
    return h.hexdigest()


def encode(v: Any, depth: int = 0) -> Any:
    """``v`` as plain data that another process's equal value encodes to (or NotStorable)."""
    if depth > DEPTH:
        raise NotStorable("state nested too deep")
    if v is None or type(v) in (bool, int, float, str):
        return v if not isinstance(v, float) else {"t": "float", "v": repr(v)}
    if isinstance(v, torch.dtype):
        return {"t": "dtype", "v": str(v)}
    if isinstance(v, torch.device):
        return {"t": "device", "v": str(v)}
    if isinstance(v, enum.Enum):
        return {"t": "enum", "class": _qualified(type(v)), "v": v.name}
    if isinstance(v, torch.Size):
        return {"t": "size", "items": list(v)}
    if type(v) in (list, tuple):
        return {"t": type(v).__name__, "items": [encode(x, depth + 1) for x in v]}
    if isinstance(v, dict):
        return {"t": "dict", "items": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if type(v) in (set, frozenset):
        return {"t": "set", "items": sorted(repr(encode(x, depth + 1)) for x in v)}
    if isinstance(v, types.FunctionType):
        if v.__closure__:
            raise NotStorable(f"{v.__qualname__} is a closure")
        return {
            "t": "function",
            "name": f"{v.__module__}.{v.__qualname__}",
            "code": fingerprint(v.__code__),
            "defaults": encode(v.__defaults__ or (), depth + 1),
            "kwdefaults": encode(v.__kwdefaults__ or {}, depth + 1),
        }
    if isinstance(v, types.BuiltinFunctionType):
        return {"t": "builtin", "name": f"{getattr(v, '__module__', None)}.{v.__qualname__}"}
    if isinstance(v, type):
        return {"t": "class", "name": _qualified(v)}
    if isinstance(v, types.ModuleType):
        return {"t": "module", "name": v.__name__}
    if isinstance(v, functools.partial):
        return {
            "t": "partial",
            "func": encode(v.func, depth + 1),
            "args": encode(v.args, depth + 1),
            "keywords": encode(v.keywords, depth + 1),
        }
    if _has_state(v):
        return {"t": "object", "class": _qualified(type(v)), "state": encode(vars(v), depth + 1)}
    raise NotStorable(f"a {type(v).__name__} in a module's state")


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def state_json(obj: Any, reads: frozenset[str] | None = None) -> Any:
    """What :class:`StateView` compares, as plain data (hook dictionaries by their
    functions: the keys are handle numbers, which differ between processes); with
    ``reads``, the recorded names too, so another process compares the same slots."""
    if isinstance(obj, torch.nn.Module):
        d = obj.__dict__
        out = []
        for k in sorted(module_keys(obj, reads)):
            v = d[k]
            hooks = k in FORWARD_HOOKS
            out.append([k, encode(list(v.values()) if hooks else v)])
        data: dict[str, Any] = {"t": "module", "class": _qualified(type(obj)), "state": out}
        absent = absent_names(obj, reads)
        if absent is not None:
            data["reads"] = sorted(reads or ())
            data["absent"] = sorted(absent)
        return data
    if isinstance(obj, dict):  # a global hook dictionary
        return encode(list(obj.values()))
    return encode(obj)


__all__ = [
    "FORWARD_HOOKS",
    "GLOBAL_HOOKS",
    "NotStorable",
    "StateView",
    "absent_names",
    "encode",
    "fast_check",
    "fingerprint",
    "has_hooks",
    "module_keys",
    "runs_unconverted",
    "same",
    "state_json",
]
