"""Graph IR data structures: immutable, slotted, hashable.

A :class:`Graph` is a list of :class:`Node` in SSA form. Each node applies an op
(declared once in :mod:`cuvil_ir.graph_ir.ops`) to input :class:`Value` s and
defines output values. Nodes may carry regions (:class:`Block`) for structured
control flow; a block has arguments, nodes and results, and sees the values of
the blocks that enclose it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Union

import sympy

from cuvil_ir.graph_ir.types import DType, Type

#: Graph IR's text form, what :attr:`Graph.text` and ``str(graph)`` give: set to
#: :func:`cuvil_ir.graph_ir.printer.print_graph` when the printer is imported (the
#: package ``cuvil_ir.graph_ir`` imports it), since the printer imports this module.
PRINT_GRAPH: Callable[..., str] | None = None


def _print(g: Graph, locations: bool) -> str:
    if PRINT_GRAPH is None:  # only while cuvil_ir.graph_ir is being imported
        raise RuntimeError("the Graph IR printer is not loaded yet (import cuvil_ir.graph_ir)")
    return PRINT_GRAPH(g, locations=locations)


@dataclass(frozen=True, slots=True)
class Ref:
    """Placeholder for the i-th input of a node inside an attribute (extern call args)."""

    index: int


@dataclass(frozen=True, slots=True)
class KV:
    """An immutable mapping attribute value: sorted (key, value) pairs."""

    items: tuple[tuple[str, AttrValue], ...]

    @staticmethod
    def of(mapping: dict[str, AttrValue]) -> KV:
        return KV(tuple(sorted(mapping.items())))

    def as_dict(self) -> dict[str, AttrValue]:
        return dict(self.items)


AttrValue = Union[None, bool, int, float, str, sympy.Basic, DType, Ref, KV, tuple["AttrValue", ...]]


@dataclass(frozen=True, slots=True)
class Loc:
    """Source location of the Python expression a node was captured from."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value. Names are unique within a graph; printing renumbers them."""

    name: str
    type: Type

    def __str__(self) -> str:
        return f"%{self.name}"


def _replace(obj: Any, changes: dict[str, Any]) -> Any:
    if all(getattr(obj, k) is v or getattr(obj, k) == v for k, v in changes.items()):
        return obj
    kwargs = {f.name: getattr(obj, f.name) for f in fields(obj)}
    kwargs.update(changes)
    return type(obj)(**kwargs)


@dataclass(frozen=True, slots=True)
class Block:
    args: tuple[Value, ...]
    nodes: tuple[Node, ...]
    results: tuple[Value, ...]

    def replace(self, **changes: Any) -> Block:
        return _replace(self, changes)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Node:
    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    regions: tuple[Block, ...] = ()
    loc: Loc | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if list(self.attrs) != sorted(self.attrs, key=lambda kv: kv[0]):
            object.__setattr__(self, "attrs", tuple(sorted(self.attrs, key=lambda kv: kv[0])))

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op} has {len(self.outputs)} outputs")
        return self.outputs[0]

    def replace(self, **changes: Any) -> Node:
        return _replace(self, changes)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Graph:
    """A function in Graph IR.

    ``assumptions`` are the size facts the graph relies on (see
    [Note: assumptions and decisions] in :mod:`cuvil_ir.symbolic`): the runtime
    checks each of them before running the graph.
    """

    name: str
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    assumptions: tuple[sympy.Basic, ...] = ()

    def replace(self, **changes: Any) -> Graph:
        return _replace(self, changes)  # type: ignore[no-any-return]

    def walk(self) -> Iterator[Node]:
        """Every node, including those nested in regions, in program order."""
        yield from _walk(self.nodes)

    def use_counts(self) -> Counter[str]:
        """How many times each value is read: by any node (regions included), a block's
        results or a graph output."""
        uses: Counter[str] = Counter()
        for n in self.walk():
            uses.update(v.name for v in n.inputs)
            for r in n.regions:
                uses.update(v.name for v in r.results)
        uses.update(v.name for v in self.outputs)
        return uses

    @property
    def symbols(self) -> tuple[sympy.Symbol, ...]:
        """Size symbols bound by the graph inputs, sorted by name."""
        syms: set[sympy.Symbol] = set()
        for v in self.inputs:
            shape = getattr(v.type, "shape", ())
            for d in shape:
                if isinstance(d, sympy.Symbol):
                    syms.add(d)
        return tuple(sorted(syms, key=lambda s: s.name))

    @property
    def text(self) -> str:
        """Canonical text: renumbered values, no locations. What `hash` covers."""
        return _print(self, locations=False)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __str__(self) -> str:
        return _print(self, locations=True)


def _walk(nodes: tuple[Node, ...]) -> Iterator[Node]:
    for n in nodes:
        yield n
        for r in n.regions:
            yield from _walk(r.nodes)
