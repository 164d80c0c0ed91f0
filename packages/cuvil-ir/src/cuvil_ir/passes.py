"""Passes as small named objects, run in ordered pipelines with their level's verifier.

A :class:`Pass` is a named function from one IR value to another of the same level
(Graph IR -> Graph IR, Tensor IR -> Tensor IR) with a line saying what it does. A
:class:`Pipeline` runs its passes in order. After each pass it can:

- verify the result with the level's verifier (:func:`cuvil_ir.graph_ir.verifier.verify`,
  :func:`cuvil_ir.tensor_ir.verify.verify`), when ``CUVIL_VERIFY_PASSES=1`` (the
  test suites set it: a pass that breaks its IR fails there, naming the pass,
  instead of surfacing as a wrong kernel later);
- hand the result to the current *pass trace* (:func:`tracing`), which
  ``CUVIL_DUMP`` uses to write the IR after every pass (:mod:`cuvil_runtime.dump`).

Verification is off by default because every verifier replays the level's rules
symbolically (milliseconds per pass on a large model, paid on every cold compile).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

IR = TypeVar("IR")

#: receives (level, pass name, the IR after the pass) for every pass run in its context
Trace = Callable[[str, str, Any], None]

_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("cuvil_pass_trace", default=None)


class PassError(RuntimeError):
    """A pass produced IR its level's verifier rejects (a compiler bug: report it)."""


@dataclass(frozen=True)
class Pass(Generic[IR]):
    name: str
    run: Callable[[IR], IR]
    #: one line: what the pass does (``cu.audit``, docs)
    what: str = ""

    def __call__(self, ir: IR) -> IR:
        return self.run(ir)


@dataclass(frozen=True)
class Pipeline(Generic[IR]):
    """``passes`` of one IR ``level``, in order; ``verifier`` raises on invalid IR."""

    level: str
    passes: tuple[Pass[IR], ...]
    verifier: Callable[[IR], Any] | None = None

    def __init__(
        self, level: str, passes: Sequence[Pass[IR]], verifier: Callable[[IR], Any] | None = None
    ) -> None:
        names = [p.name for p in passes]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline {level}: pass names repeat: {names}")
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "passes", tuple(passes))
        object.__setattr__(self, "verifier", verifier)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def __call__(self, ir: IR, *, verify: bool | None = None) -> IR:
        for p in self.passes:
            ir = self.produced(p.name, p.run(ir), verify=verify)
        return ir

    def produced(self, name: str, ir: IR, *, verify: bool | None = None) -> IR:
        """``ir`` as step ``name`` made it: verified (when on) and reported to the pass
        trace. Each pass goes through here; so does a step that makes this level's IR from
        another's (lowering to Tensor IR)."""
        if (verifying() if verify is None else verify) and self.verifier is not None:
            try:
                self.verifier(ir)
            except Exception as e:
                raise PassError(f"{self.level} pass {name!r} produced invalid IR: {e}") from e
        trace = _TRACE.get()
        if trace is not None:
            trace(self.level, name, ir)
        return ir


def verifying() -> bool:
    """Whether pipelines verify after every pass (``CUVIL_VERIFY_PASSES=1``)."""
    return os.environ.get("CUVIL_VERIFY_PASSES", "") not in ("", "0")


@contextlib.contextmanager
def tracing(trace: Trace) -> Iterator[None]:
    """Every pipeline run in this context (this thread, this task) reports each pass to ``trace``."""
    token = _TRACE.set(trace)
    try:
        yield
    finally:
        _TRACE.reset(token)


__all__ = ["IR", "Pass", "PassError", "Pipeline", "Trace", "tracing", "verifying"]
