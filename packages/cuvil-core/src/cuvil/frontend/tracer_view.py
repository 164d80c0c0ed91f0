"""What the tracer's helpers see of it: :class:`TracerView`.

:class:`cuvil.frontend.tracer.Tracer` imports the modules it delegates to (proxies,
``int(t)`` of data-dependent sizes, metadata and layout queries), and those take the
tracer as an argument or hold it (``TensorProxy._cuvil_tracer``). They name it by this
protocol, which sits below all of them, so no import points back up to the tracer.
"""

from __future__ import annotations

from typing import Any, Protocol

import sympy
from torch.overrides import TorchFunctionMode

from cuvil.errors import SourceLoc
from cuvil_ir.graph_ir.fake import SymMirror
from cuvil_ir.graph_ir.nodes import Loc, Node, Value
from cuvil_ir.graph_ir.types import Type
from cuvil_ir.symbolic import ShapeContext

#: a layout guard: (argument leaf, dim order outermost first, argument name); the
#: tracer keeps those answers used (``Tracer.layout_guards``, cuvil/frontend/layout.py)
LayoutGuard = tuple[int, tuple[int, ...], str]


class TracerView(Protocol):
    """The part of :class:`~cuvil.frontend.tracer.Tracer` its helpers use."""

    #: the capture's sizes: hints, facts, and torch's symbolic mirror of them
    ctx: ShapeContext
    mirror: SymMirror
    #: the nodes recorded so far in the innermost open region
    nodes: list[Node]
    #: data-dependent size symbols some result already has (cuvil/frontend/data_sizes.py)
    seen_data_sizes: set[sympy.Symbol]
    #: the undeclared calls being decomposed, innermost last (cuvil/frontend/decompose.py)
    decomposing: list[Any]
    #: the layout guards ``is_contiguous()`` answers needed, by argument leaf
    layout_guards: dict[int, LayoutGuard]

    def handle(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record one torch-level call (the torch-function handler)."""
        ...

    def mode(self) -> TorchFunctionMode:
        """The torch-function mode user code is traced under."""
        ...

    def value_of(self, h: Any) -> Value:
        """The graph value a proxy, tensor, number or size stands for."""
        ...

    def _fresh(self, t: Type) -> Value:
        """A new graph value of type ``t`` (a node's result)."""
        ...

    def sym(self, value: Any) -> Any:
        """Our size expression for a ``torch.SymInt`` held by user code."""
        ...

    def size(self, d: Any) -> Any:
        """The ``torch.SymInt`` user code sees for a size expression."""
        ...

    def example_dim(self, d: Any) -> int:
        """A proxy's concrete size."""
        ...

    def sync(self, reason: str | None = None) -> None:
        """Facts torch decided while user code computed with sizes become assumptions."""
        ...

    def source_loc(self) -> SourceLoc | None:
        """Where in user code the call being traced is."""
        ...

    def loc(self) -> Loc | None:
        """The same, as a Graph IR location."""
        ...


__all__ = ["LayoutGuard", "TracerView"]
