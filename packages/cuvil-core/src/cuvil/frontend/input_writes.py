"""Argument tensors the function updates in place.

[Note: argument tensors updated in place]
A function may update an argument tensor in place: transformers' ``StaticCache``
writes each step's keys into preallocated tensors (``self.keys.index_copy_(2, pos, k)``)
and counts tokens with ``self.cumulative_length.add_(n)``. Eager changes the caller's
tensors; a compiled graph computes values. So the tracer records such an update
functionally (the proxy now stands for the updated value, ``Tracer.rebind``) and notes
the input (``Tracer.input_writes``); when the trace ends, each updated argument's final
value becomes a graph output, and after each run it is copied into the caller's tensor
(``copy_``: same object, same storage, views of it see the change), before the results
are returned, as eager leaves it. Where no one can tell the difference, an overwrite
(``index_copy_``, ...) writes the caller's tensor itself instead, and that copy is of the
tensor onto itself ([Note: updates in place] in ``cuvil_ir/graph_ir/in_place.py``).

Only argument tensors may be updated so: a parameter, a buffer, or a tensor the code
reads from a global or closure is read-only in compiled code (guards and warm starts
treat them as the program's constants), and updating one in place is a
:class:`CompileError` naming the line.
"""

from __future__ import annotations

from typing import Any

from cuvil.errors import CompileError
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.nodes import Value

_READ_ONLY = (
    "parameters, buffers and tensors read from globals or closures are read-only in compiled "
    "code; use the out-of-place op (e.g. `x = x + 1` instead of `x += 1`), or pass the tensor "
    "as an argument"
)


def plan(
    tracer: Tracer, traced_leaves: list[Any], outputs: list[Value], returned: list[Any]
) -> tuple[tuple[int, int], ...]:
    """Per argument leaf updated in place: (leaf index, graph output index of its final
    value), each final value appended to ``outputs``; raises for any other input."""
    leaf_of = {id(p): i for i, p in enumerate(traced_leaves) if isinstance(p, TensorProxy)}
    out: list[tuple[int, int]] = []
    done: set[int] = set()
    for proxy, before, loc in tracer.input_writes:
        if id(proxy) in done:
            continue
        i = leaf_of.get(id(proxy))
        if i is None:
            raise CompileError(f"in-place update of the input %{before.name}", loc, _READ_ONLY)
        done.add(id(proxy))
        out.append((i, len(outputs)))
        outputs.append(tracer.value_of(proxy))
        returned.append(proxy)
    return tuple(out)


__all__ = ["plan"]
