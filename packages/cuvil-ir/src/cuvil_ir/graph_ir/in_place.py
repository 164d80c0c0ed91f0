"""Argument tensors overwritten in place instead of through a copy.

[Note: updates in place]
An in-place torch call recorded as an ``extern`` with ``mutates = i`` is a pure function
of its inputs: its reference clones operand ``i`` and updates the clone, and the final
value is copied into the caller's tensor after the run ([Note: argument tensors updated
in place] in ``cuvil/frontend/input_writes.py``). For a decoder's static KV cache that is
two copies of every layer's whole cache per step (the clone, then the copy back), growing
with the context, to write one row.

:func:`mark` lets such a call write the argument itself (``in_place = true`` on the node)
when nothing can tell the difference:

* the operand is a graph input that the capture found updated in place (an argument
  leaf, never module state, which is read-only in compiled code), read by this call
  alone: no other node, region or output reads the value it had before the update;
* the call overwrites (``index_copy_``, ``copy_``, ``__setitem__``, ``fill_``, ``zero_``,
  ``masked_fill_``, ``index_fill_``, ``index_put_`` without ``accumulate``): what it
  writes does not depend on what was there, and its other operands cannot depend on the
  old value (the one-reader rule), so a call that fails after it leaves the argument as
  eager would have left it, and running it again writes the same values;
* at run time, per call, the argument shares its storage with no other input of the
  graph (:func:`exclusive`): a second input viewing the same memory would otherwise see
  the update at whatever point the compiled program reads it, not where eager would.

The flag is honoured only while :func:`allowed` says so, which the caller that made that
per-call check sets around the run (``cuvil/artifacts.py``); every other way of running a
graph (the reference executor, a loaded artifact, a region run on its own) clones as
before. The result of a call so marked is the argument itself, and the write-back of the
final value is then ``t.copy_(t)``, which ATen returns at once.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from cuvil_ir.graph_ir.nodes import Graph, Node

#: in-place torch calls whose result does not depend on the values they overwrite
OVERWRITES = frozenset(
    {
        "index_copy_",
        "copy_",
        "__setitem__",
        "fill_",
        "zero_",
        "masked_fill_",
        "index_fill_",
        "index_put_",
    }
)

_state = threading.local()


def _method(target: Any) -> str:
    name = str(target)
    return name.split(".")[3] if name.startswith("torch.ops.") else name.rsplit(".", 1)[-1]


def _overwrites(n: Node) -> bool:
    name = _method(n.attr("target"))
    if name not in OVERWRITES:
        return False
    if name == "index_put_":  # index_put_(indices, values, accumulate=False)
        args, kwargs = n.attr("args"), n.attr("kwargs")
        acc = dict(kwargs).get("accumulate", False) if isinstance(kwargs, tuple) else False  # type: ignore[arg-type]
        if isinstance(args, tuple) and len(args) > 3:
            acc = args[3]
        return acc is False
    return True


def mark(graph: Graph, updated: Sequence[int]) -> tuple[Graph, tuple[int, ...]]:
    """``graph`` with ``in_place = true`` on each top-level overwrite of an input of
    ``updated`` (graph input indices of arguments updated in place) that the rules of
    [Note: updates in place] allow, and the indices of the inputs so written."""
    if not updated:
        return graph, ()
    index = {graph.inputs[i].name: i for i in updated}
    counts = graph.use_counts()
    nodes = list(graph.nodes)
    written: list[int] = []
    for k, n in enumerate(nodes):
        m = n.attr("mutates")
        if n.op != "extern" or not isinstance(m, int) or m >= len(n.inputs) or n.attr("in_place"):
            continue
        target = n.inputs[m]
        i = index.get(target.name)
        if i is None or counts[target.name] != 1 or not _overwrites(n):
            continue
        nodes[k] = n.replace(attrs=(*n.attrs, ("in_place", True)))
        written.append(i)
    if not written:
        return graph, ()
    return graph.replace(nodes=tuple(nodes)), tuple(sorted(written))


def exclusive(inputs: Sequence[Any], written: Sequence[int]) -> bool:
    """Whether each input of ``written`` shares its storage with no other tensor of ``inputs``.

    A tensor lies in a storage exactly when its first element's address lies in the
    storage's bytes (storages do not overlap), so the others are checked by ``data_ptr``,
    no storage object made for each (a decoder's step has hundreds of inputs)."""
    import torch

    spans = []
    for i in written:
        t = inputs[i]
        if not isinstance(t, torch.Tensor):
            return False
        s = t.untyped_storage()
        start = s.data_ptr()
        if start == 0:  # no bytes (an empty tensor): nothing to tell apart, clone as before
            return False
        spans.append((start, start + s.nbytes()))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return False  # two of them in one storage
    # sorted and disjoint: the one span a pointer can lie in is the last starting at or
    # before it (a bisection, not a scan of all spans per input: this runs every call)
    starts = [a for a, _ in spans]
    ends = [b for _, b in spans]
    lo, hi = starts[0], ends[-1]
    chosen = set(written)
    tensor = torch.Tensor
    # most pointers (a model's weights) lie outside every span: one comparison each, the
    # bisection only for those between the first span's start and the last one's end
    near = [
        p
        for j, t in enumerate(inputs)
        if j not in chosen and isinstance(t, tensor) and lo <= (p := t.data_ptr()) < hi
    ]
    for p in near:
        k = bisect.bisect_right(starts, p) - 1
        if k >= 0 and p < ends[k]:
            return False
    return True


def allowed() -> bool:
    """Whether calls marked ``in_place`` may write their operand now (this thread)."""
    return getattr(_state, "on", False)


@contextlib.contextmanager
def writing(on: bool) -> Iterator[None]:
    """Marked calls write their operand (``on``) or a clone of it, in this thread, inside."""
    before = getattr(_state, "on", False)
    _state.on = on
    try:
        yield
    finally:
        _state.on = before


__all__ = ["OVERWRITES", "allowed", "exclusive", "mark", "writing"]
