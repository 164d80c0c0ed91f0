"""IR objects as plain data (JSON), for caches that must never run what they read.

``pickle.loads`` runs whatever the bytes ask for, so a cache entry someone else
wrote would be code. :class:`Codec` writes an object tree as JSON instead and
reads it back by rebuilding only what it was told about:

* ``None``, ``bool``, ``int``, ``float`` and ``str`` as themselves (JSON keeps
  ``1`` and ``1.0`` apart; ``inf`` and ``nan`` use Python's JSON spellings);
* tuples, lists, dicts (any hashable keys) and frozensets;
* instances of the dataclasses and enums the codec was built with (by default
  every dataclass and enum of the Graph, Tensor and Loop IR modules), rebuilt by
  calling the class with its fields, so ``__post_init__`` checks run again;
* sympy expressions made of an allowed set of classes (symbols with their
  assumptions, numbers, arithmetic, ``floor``/``Max``/relations/logic ...),
  rebuilt with ``evaluate=False``, so the tree comes back as it was.

Anything else is refused when encoding (:class:`SerialError`: the caller then
does not cache) and when decoding (a malformed or unknown entry is an error,
never an import or a call of something named by the data).

The encoding is a table: each container, dataclass or expression appears once,
children before parents, and is referred to by its position (``["@", n]``).
Sharing follows object identity, never Python equality: ``-0.0 == 0.0`` and
``1 == True``, so merging equal objects could change a program. Immutable values
(tuples, frozensets, enums, frozen dataclasses, sympy expressions) are also shared
when their *encodings* are equal (which keeps ``-0.0`` and ``0.0``, ``1`` and
``True`` apart): otherwise equal trees would encode differently depending on which
equal objects happen to be one object (a size tuple a cache returned twice, or two
equal ones made afresh), and saving the same program twice would not give the same
bytes. Lists, dicts and mutable dataclasses are shared by identity only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import sympy

FORMAT = 1


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a document is decoded.

    Decoding makes tens of thousands of objects at once (the JSON table, then the
    IR), none of them cyclic garbage. In a process holding torch's millions of
    objects, that many allocations set off a full collection (~0.1 s on a warm
    start's critical path) which finds nothing to free; the JSON table is freed by
    reference counting as soon as the decode ends. A collector the caller turned off
    stays off; collections resume after, as usual."""
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class SerialError(ValueError):
    """An object that cannot be written as plain data, or data that is not a valid encoding."""


_SYMPY_CLASSES: tuple[type, ...] = (
    sympy.Add,
    sympy.Mul,
    sympy.Pow,
    sympy.Mod,
    sympy.floor,
    sympy.ceiling,
    sympy.Max,
    sympy.Min,
    sympy.Abs,
    sympy.sign,
    sympy.Piecewise,
    sympy.functions.elementary.piecewise.ExprCondPair,
    sympy.Eq,
    sympy.Ne,
    sympy.Lt,
    sympy.Le,
    sympy.Gt,
    sympy.Ge,
    sympy.And,
    sympy.Or,
    sympy.Not,
)
_SYMPY_ATOMS: tuple[Any, ...] = (
    sympy.true,
    sympy.false,
    sympy.S.Zero,
    sympy.S.One,
    sympy.S.NegativeOne,
    sympy.S.Half,
    sympy.oo,
    -sympy.oo,
    sympy.nan,
    sympy.zoo,
)


def _ir_modules() -> list[ModuleType]:
    from cuvil_ir.graph_ir import nodes, types
    from cuvil_ir.tensor_ir import expr, memory, program

    return [nodes, types, expr, program, memory]


def _classes_of(module: ModuleType) -> list[type]:
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    ]


def _immutable(obj: Any) -> bool:
    """Whether sharing ``obj``'s entry with an equal encoding's cannot change what decodes."""
    if isinstance(obj, (tuple, frozenset, enum.Enum, sympy.Basic)):
        return True
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        params = getattr(type(obj), "__dataclass_params__", None)
        return bool(params is not None and params.frozen)
    return False


class Codec:
    """Encode and decode trees of the given dataclasses and enums (plus the IR's own)."""

    def __init__(self, extra: Iterable[type] = ()) -> None:
        classes = [c for m in _ir_modules() for c in _classes_of(m)] + list(extra)
        self._by_name: dict[str, type] = {}
        for cls in classes:
            name = f"{cls.__module__}.{cls.__qualname__}"
            if not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)):
                raise TypeError(f"{name} is neither a dataclass nor an enum")
            self._by_name[name] = cls
        self._name_of = {cls: name for name, cls in self._by_name.items()}
        self._sympy_by_name = {c.__name__: c for c in _SYMPY_CLASSES}
        self._atoms_by_name = {type(a).__name__: a for a in _SYMPY_ATOMS}

    # -- encoding ------------------------------------------------------------------------------------------

    def dumps(self, obj: Any) -> bytes:
        """``obj`` as compact JSON bytes (deterministic for the same object graph)."""
        table: list[Any] = []
        memo: dict[Any, Any] = {}
        keep: list[Any] = []  # ids stay unique while the objects they name are alive
        root = self._enc(obj, table, memo, keep)
        return json.dumps({"format": FORMAT, "table": table, "root": root}, separators=(",", ":")).encode()

    def _enc(self, obj: Any, table: list[Any], memo: dict[Any, Any], keep: list[Any]) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int) and not isinstance(obj, enum.Enum):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        # Symbols by value: two equal ones (same name and assumptions, one made by the
        # capture, one decoded from a cache) are interchangeable, and one entry for both
        # keeps the encoding the same whichever objects the tree happens to hold
        key: Any = (
            ("Y", obj.name, tuple(sorted(obj.assumptions0.items()))) if type(obj) is sympy.Symbol else id(obj)
        )
        ref = memo.get(key)
        if ref is not None:
            return ref
        entry = self._entry(obj, table, memo, keep)
        keep.append(obj)
        by_value = None
        if _immutable(obj):  # one entry for equal encodings (see the module doc)
            by_value = ("=", json.dumps(entry, separators=(",", ":")))
            ref = memo.get(by_value)
            if ref is not None:
                memo[key] = ref
                return ref
        table.append(entry)
        ref = ["@", len(table) - 1]
        memo[key] = ref
        if by_value is not None:
            memo[by_value] = ref
        return ref

    def _entry(self, obj: Any, table: list[Any], memo: dict[Any, Any], keep: list[Any]) -> Any:
        def enc(x: Any) -> Any:
            return self._enc(x, table, memo, keep)

        if isinstance(obj, sympy.Basic):
            return self._sympy_entry(obj, enc)
        cls = type(obj)
        if cls is tuple:
            return ["T", [enc(x) for x in obj]]
        if cls is list:
            return ["L", [enc(x) for x in obj]]
        if cls is dict:
            return ["M", [[enc(k), enc(v)] for k, v in obj.items()]]
        if cls is frozenset:
            return ["F", [enc(x) for x in obj]]
        name = self._name_of.get(cls)
        if name is None:
            raise SerialError(f"cannot encode an object of type {cls.__module__}.{cls.__qualname__}")
        if isinstance(obj, enum.Enum):
            return ["E", name, enc(obj.value)]
        return ["D", name, {f.name: enc(getattr(obj, f.name)) for f in dataclasses.fields(obj)}]

    def _sympy_entry(self, obj: sympy.Basic, enc: Any) -> Any:
        cls = type(obj)
        if cls is sympy.Symbol:
            return ["Y", obj.name, {k: v for k, v in sorted(obj.assumptions0.items())}]
        if isinstance(obj, sympy.Integer):
            return ["I", int(obj)]
        if cls is sympy.Rational:
            return ["Q", int(obj.p), int(obj.q)]
        if cls is sympy.Float:
            sign, man, exp, bc = obj._mpf_
            return ["R", [int(sign), hex(man)[2:], int(exp), int(bc)], int(obj._prec)]
        for atom in _SYMPY_ATOMS:
            if obj is atom:
                return ["A", cls.__name__]
        if self._sympy_by_name.get(cls.__name__) is cls:
            return ["X", cls.__name__, [enc(a) for a in obj.args]]
        raise SerialError(f"cannot encode the sympy object {obj} (class {cls.__name__})")

    # -- decoding ------------------------------------------------------------------------------------------

    def loads(self, data: bytes) -> Any:
        """The object :meth:`dumps` wrote; :class:`SerialError` for anything else."""
        with _collector_paused():
            return self._loads(data)

    def _loads(self, data: bytes) -> Any:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise SerialError(f"not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("table"), list):
            raise SerialError("not an encoding of this format")
        built: list[Any] = []
        for i, entry in enumerate(doc["table"]):
            try:
                built.append(self._build(entry, built))
            except SerialError:
                raise
            except Exception as e:  # a class's own checks refused the fields, or a malformed entry
                raise SerialError(f"entry {i}: {type(e).__name__}: {e}") from e
        return self._value(doc.get("root"), built)

    def _value(self, x: Any, built: list[Any]) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if (
            isinstance(x, list)
            and len(x) == 2
            and x[0] == "@"
            and type(x[1]) is int
            and 0 <= x[1] < len(built)
        ):
            return built[x[1]]
        raise SerialError(f"bad value {x!r:.80}")

    def _build(self, entry: Any, built: list[Any]) -> Any:
        if not isinstance(entry, list) or not entry or not isinstance(entry[0], str):
            raise SerialError(f"bad entry {entry!r:.80}")
        tag, rest = entry[0], entry[1:]

        def val(x: Any) -> Any:
            return self._value(x, built)

        def items(x: Any) -> list[Any]:
            if not isinstance(x, list):
                raise SerialError(f"bad items {x!r:.80}")
            return [val(v) for v in x]

        if tag == "T" and len(rest) == 1:
            return tuple(items(rest[0]))
        if tag == "L" and len(rest) == 1:
            return items(rest[0])
        if tag == "F" and len(rest) == 1:
            return frozenset(items(rest[0]))
        if tag == "M" and len(rest) == 1 and isinstance(rest[0], list):
            out = {}
            for pair in rest[0]:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise SerialError("bad dict item")
                out[val(pair[0])] = val(pair[1])
            return out
        if tag in ("E", "D") and len(rest) == 2:
            cls = self._by_name.get(rest[0]) if isinstance(rest[0], str) else None
            if cls is None:
                raise SerialError(f"unknown class {rest[0]!r:.80}")
            if tag == "E":
                if not issubclass(cls, enum.Enum):
                    raise SerialError(f"{rest[0]} is not an enum")
                return cls(val(rest[1]))
            return self._dataclass(cls, rest[1], val)
        if tag in ("Y", "I", "Q", "R", "A", "X"):
            return self._sympy(tag, rest, val)
        raise SerialError(f"bad entry tag {tag!r:.20}")

    def _dataclass(self, cls: type, fields_doc: Any, val: Any) -> Any:
        if not dataclasses.is_dataclass(cls) or not isinstance(fields_doc, dict):
            raise SerialError(f"bad fields for {cls.__qualname__}")
        fields = dataclasses.fields(cls)
        if set(fields_doc) != {f.name for f in fields}:
            raise SerialError(f"{cls.__qualname__}: fields {sorted(fields_doc)} do not match the class")
        init = {f.name: val(fields_doc[f.name]) for f in fields if f.init}
        obj = cls(**init)
        for f in fields:
            if not f.init:
                object.__setattr__(obj, f.name, val(fields_doc[f.name]))
        return obj

    def _sympy(self, tag: str, rest: list[Any], val: Any) -> Any:
        if tag == "Y" and len(rest) == 2 and isinstance(rest[0], str) and isinstance(rest[1], dict):
            if not all(isinstance(v, bool) for v in rest[1].values()):
                raise SerialError("bad symbol assumptions")
            return sympy.Symbol(rest[0], **rest[1])
        if tag == "I" and len(rest) == 1 and type(rest[0]) is int:
            return sympy.Integer(rest[0])
        if tag == "Q" and len(rest) == 2 and all(type(v) is int for v in rest):
            return sympy.Rational(rest[0], rest[1])
        if tag == "R" and len(rest) == 2 and isinstance(rest[0], list) and type(rest[1]) is int:
            sign, man, exp, bc = rest[0]
            if not (type(sign) is int and isinstance(man, str) and type(exp) is int and type(bc) is int):
                raise SerialError("bad float")
            int(man, 16)  # a hex mantissa, nothing else
            return sympy.Float((sign, man, exp, bc), precision=rest[1])
        if tag == "A" and len(rest) == 1 and rest[0] in self._atoms_by_name:
            return self._atoms_by_name[rest[0]]
        if tag == "X" and len(rest) == 2 and rest[0] in self._sympy_by_name and isinstance(rest[1], list):
            cls = self._sympy_by_name[rest[0]]
            args = [val(a) for a in rest[1]]
            if not all(isinstance(a, sympy.Basic) for a in args):
                raise SerialError(f"{rest[0]} with a non-sympy argument")
            try:
                return cls(*args, evaluate=False)
            except TypeError:
                return cls(*args)
        raise SerialError(f"bad sympy entry {[tag, *rest]!r:.80}")


__all__ = ["Codec", "SerialError"]
