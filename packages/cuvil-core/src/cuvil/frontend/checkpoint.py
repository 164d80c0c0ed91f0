"""What a tracer checkpoint holds, and what rolling back to it leaves as it is.

:meth:`cuvil.frontend.tracer.Tracer.checkpoint` takes a :class:`Checkpoint`;
:meth:`~cuvil.frontend.tracer.Tracer.rollback` restores it. The fields below are the
list of what a rollback restores; [Note: tracer checkpoints] says what it leaves.
:class:`Recording` is that contract as a type, for the modules the tracer imports
(``decompose.py``), which therefore do not import the tracer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sympy

from cuvil.frontend.layout import LayoutGuard
from cuvil.frontend.proxy import TensorProxy
from cuvil_ir.graph_ir.nodes import Node, Value

# [Note: tracer checkpoints]
# A decomposition is recorded tentatively (cuvil/frontend/decompose.py, `attempt`) and
# forgotten when it needs something undeclared. `Tracer.checkpoint` is the one place
# that knows what forgetting means; `rollback` restores it in place. Left as they are,
# on purpose: the value counter (names are never reused, so the names of later values,
# and the goldens, do not depend on whether an attempt was kept), the region of each
# value (a forgotten value is never looked up), tensors kept alive, reads (a guard too
# many costs a recompile at most) and size assumptions, ours and torch's `ShapeEnv`'s
# alike (they hold for the example sizes; a fact torch keeps and the graph forgot
# would be an unchecked assumption). A checkpoint is rolled back in the block it was
# taken in: an attempt opens and closes its regions inside itself.


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The recording state at :meth:`Tracer.checkpoint`: lengths of what only grows,
    copies of what may change."""

    nodes: int
    inputs: int
    lifted: int
    consts: dict[tuple[type, Any], Value]
    lifted_ids: dict[int, TensorProxy]
    names: frozenset[str]
    seen_data_sizes: frozenset[sympy.Symbol]
    data_symbols: frozenset[sympy.Symbol]
    hints: dict[sympy.Symbol, int] | None
    layout_guards: dict[int, LayoutGuard]
    input_writes: int


class Recording(Protocol):
    """What recording tentatively needs of the tracer: checkpoints and the size facts
    a rolled-back attempt must not have learnt (``decompose.attempt``)."""

    seen_data_sizes: set[sympy.Symbol]

    def checkpoint(self) -> Checkpoint: ...

    def recorded_since(self, cp: Checkpoint) -> Sequence[Node]: ...

    def rollback(self, cp: Checkpoint) -> None: ...


def restore(now: Any, before: Any) -> None:
    """Set collection ``now`` (a set or dict) to the contents of ``before``, in place."""
    now.clear()
    now.update(before)


__all__ = ["Checkpoint", "Recording", "restore"]
