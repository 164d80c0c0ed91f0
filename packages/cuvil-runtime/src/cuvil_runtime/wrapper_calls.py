"""What a generated wrapper calls per call, besides the kernels and extern functions.

The results of externs owned outside the arena (:func:`own`), the expanded-input test
of [Note: strided inputs] (:func:`expanded`), RNG seeds (:func:`draw_seed`), a kernel's
integer division by zero (:func:`zero_division`), attributes evaluated with sizes
bound during the call (:func:`late_attr`, :func:`late_attrs`), the single result of a
view op (:func:`one`), and the callables that run a ``Control`` step's regions
(:func:`region_call`: ``if``, ``for``, ``while``). The wrapper's namespace names them
``_own``, ``_expanded``, ...: see ``ProgramRunner._generate`` in cuvil_runtime.runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import sympy
import torch

from cuvil_ir.tensor_ir.program import Control
from cuvil_runtime.executor import evaluate_attr


class Region(Protocol):
    """A region's runner (a ``ProgramRunner``)."""

    def run(self, bindings: dict[str, int], *inputs: Any) -> tuple[Any, ...]: ...


def own(t: torch.Tensor, arena: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """``t`` in the layout its buffer has (row-major, or channels-last) and not sharing
    the arena's storage."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if t.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr():
        return t.clone(memory_format=fmt)
    return t.contiguous(memory_format=fmt)


def expanded(t: torch.Tensor) -> bool:
    """``t`` has a zero stride on a dim of size > 1 (an ``expand``: its copy would be
    larger than its storage)."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def draw_seed() -> int:
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))


def zero_division() -> None:
    raise ZeroDivisionError("ZeroDivisionError: integer division or modulo by zero")


def late_attr(value: Any, bindings: dict[sympy.Symbol, int]) -> Any:
    return evaluate_attr(value, bindings)


def late_attrs(attrs: Any, bindings: dict[sympy.Symbol, int]) -> dict[str, Any]:
    return {k: evaluate_attr(v, bindings) for k, v in attrs}


def one(result: Any) -> Any:
    """The single result of a view op, which may return it as a one-element tuple."""
    return result[0] if isinstance(result, (tuple, list)) else result


def region_call(step: Control, regions: Sequence[Region]) -> Callable[..., tuple[Any, ...]]:
    """What runs ``step`` (an ``if``, ``for`` or ``while``) on its region runners: called
    with the bindings, then the step's operands (the node's inputs, then its free values)."""
    node = step.node
    n_free = len(step.inputs) - len(node.inputs)

    def truth(v: Any) -> bool:
        return bool(v.item()) if isinstance(v, torch.Tensor) else bool(v)

    if node.op == "if":

        def run_if(b: dict[str, int], pred: Any, *free: Any) -> tuple[Any, ...]:
            return regions[0 if truth(pred) else 1].run(b, *free)

        return run_if
    if node.op == "for":
        var = str(node.attr("var"))

        def run_for(b: dict[str, int], start: Any, stop: Any, step_: Any, *rest: Any) -> tuple[Any, ...]:
            carried = rest[: len(rest) - n_free]
            free = rest[len(rest) - n_free :]
            for i in range(int(start), int(stop), int(step_)):
                carried = regions[0].run({**b, var: i}, *carried, *free)
            return tuple(carried)

        return run_for

    def run_while(b: dict[str, int], *rest: Any) -> tuple[Any, ...]:
        carried = rest[: len(rest) - n_free]
        free = rest[len(rest) - n_free :]
        while truth(regions[0].run(b, *carried, *free)[0]):
            carried = regions[1].run(b, *carried, *free)
        return tuple(carried)

    return run_while
