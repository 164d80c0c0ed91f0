"""Guards: what a compiled artifact assumed about its inputs, checked on each call.

Two layers, cheapest first:

1. the *structure key*: the argument tree, each tensor's dtype/device/rank
   (and sizes with ``dynamic=False``), each Python value (specialised), the
   module's parameter metadata and training flags -- compared as one tuple;
2. the graph's *assumptions* on size symbols (``Eq(x_1, 16)``, ``Ne(x_0, 1)``),
   compiled once into a Python predicate over the bound sizes.

When no artifact passes, :func:`explain_miss` says which guard failed, in
words, for ``stats.recompile_reasons``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.types import DType

_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device)


def leaf_key(leaf: Any, dynamic: bool) -> tuple[Any, ...]:
    """What a compiled artifact depends on for one argument leaf."""
    if isinstance(leaf, torch.Tensor):
        return ("tensor", leaf.dtype, leaf.device, leaf.dim(), None if dynamic else tuple(leaf.shape))
    if isinstance(leaf, _SCALARS):
        return ("value", type(leaf), leaf)
    return ("object", type(leaf), id(leaf))


def describe_leaf(key: tuple[Any, ...]) -> str:
    if key[0] == "tensor":
        dtype = DType.from_torch(key[1]).value if isinstance(key[1], torch.dtype) else key[1]
        shape = "" if key[4] is None else f", shape {list(key[4])}"
        return f"a {dtype} tensor of rank {key[3]} on {key[2]}{shape}"
    if key[0] == "value":
        return f"{key[1].__name__} {key[2]!r}"
    return f"a {key[1].__name__} object (id {key[2]})"


@dataclass(frozen=True, slots=True)
class SymbolSlot:
    """Where a size symbol is read from: leaf ``leaf``'s dimension ``axis``."""

    symbol: sympy.Symbol
    leaf: int
    axis: int
    leaf_name: str


class AssumptionCheck:
    """The graph's assumptions as one fast predicate over the inputs' sizes."""

    def __init__(
        self, assumptions: Sequence[sympy.Basic], slots: Sequence[SymbolSlot], reasons: dict[Any, str]
    ):
        self.assumptions = tuple(assumptions)
        self.slots = tuple(slots)
        self.reasons = reasons
        self.symbols = sorted({s.symbol for s in slots}, key=lambda s: s.name)
        self._index = {s: i for i, s in enumerate(self.symbols)}
        self._all: Callable[..., bool] | None = None
        if self.assumptions:
            self._all = sympy.lambdify(self.symbols, sympy.And(*self.assumptions), modules="math")

    def bind(self, leaves: Sequence[Any]) -> list[int] | str:
        """Symbol values from the leaves, or a message when two inputs disagree."""
        values: list[int | None] = [None] * len(self.symbols)
        for slot in self.slots:
            size = int(leaves[slot.leaf].shape[slot.axis])
            i = self._index[slot.symbol]
            if values[i] is None:
                values[i] = size
            elif values[i] != size:
                return f"{slot.symbol} is {values[i]} elsewhere but {slot.leaf_name}.shape[{slot.axis}] is {size}"
        return values  # type: ignore[return-value]

    def holds(self, leaves: Sequence[Any]) -> bool:
        values = self.bind(leaves)
        if isinstance(values, str):
            return False
        return self._all is None or bool(self._all(*values))

    def explain(self, leaves: Sequence[Any]) -> str:
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


def explain_structure(
    names: Sequence[str], old: tuple[Any, ...], new: tuple[Any, ...], extra_old: Any, extra_new: Any
) -> str:
    if len(old) != len(new):
        return f"the arguments changed structure ({len(old)} leaves before, {len(new)} now)"
    for name, a, b in zip(names, old, new):
        if a != b:
            return f"argument {name}: was {describe_leaf(a)}, now {describe_leaf(b)}"
    if extra_old != extra_new:
        return "module state changed (training mode, submodules, or parameter/buffer metadata)"
    return "the argument tree changed structure"
