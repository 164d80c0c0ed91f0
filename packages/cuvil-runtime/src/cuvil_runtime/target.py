"""What a backend is, as data: the contract between ``cuvil`` and every target.

A distribution registers a backend with an entry point in the group
``cuvil.backends`` whose name is the target string and whose value is a
:class:`BackendSpec`. Importing the spec must be cheap: heavy imports (a
toolchain, triton, a vendor runtime) happen in ``check`` and ``factory``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cuvil_ir.graph_ir.nodes import Graph


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a target can run; the frontend consults this, never the target's name."""

    #: torch device types the target executes on ("cpu", "cuda", "npu")
    devices: frozenset[str] = frozenset({"cpu"})
    #: Graph IR ops with regions (if/for/while) run natively
    control_flow: bool = False
    #: ops with the ``opaque`` trait (extern torch calls) can be run
    extern_calls: bool = True


@dataclass(frozen=True, slots=True)
class CompileOptions:
    opt_level: int = 2
    #: extra per-target settings, as sorted (key, value) pairs so options hash
    extra: tuple[tuple[str, Any], ...] = ()


class Executable(Protocol):
    """A compiled graph: graph inputs in order (tensors, Python scalars) → flat outputs."""

    def __call__(self, *inputs: Any) -> tuple[Any, ...]: ...


class Target(Protocol):
    name: str
    capabilities: Capabilities

    def compile(self, graph: Graph, options: CompileOptions) -> Executable: ...


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """The object a ``cuvil.backends`` entry point resolves to."""

    name: str
    description: str
    #: builds the target; called only when the target is requested
    factory: Callable[[], Target]
    #: returns ``None`` when usable, else why not (e.g. "no C compiler found")
    check: Callable[[], str | None] = field(default=lambda: None)
    #: what to install to get it, e.g. "pip install 'cuvil[cpu]'" (None: built in)
    install: str | None = None
    #: ``target=None`` picks the available target with the highest priority
    priority: int = 0
    capabilities: Capabilities = field(default_factory=Capabilities)
