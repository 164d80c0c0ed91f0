"""The captured graph's outputs alias as eager's results do.

A target gives an output that the graph reaches from an input (or from another
output) through view ops alone as that view, and the same value returned twice as one
object (see [Note: output aliasing] in :mod:`cuvil_ir.graph_ir.aliases`). Graph IR
values are immutable, so the graph alone can claim more aliasing than eager has: a
``clone`` is its input's value, and ``x.contiguous()`` is ``x``'s value whether eager
returned ``x`` or a copy. The proxies know what eager did (a view's ``_cuvil_base`` is
the tensor whose storage it shares, a clone has none), so :func:`settle` checks each
output the graph would alias against them and returns a ``clone`` node's value where
eager gives a new tensor. Two results that are views of one fresh tensor no output is
(``y = x + 1; return y[0], y[1]``) share its storage in eager: that tensor becomes an
extra graph output after every other, which the call does not return.
"""

from __future__ import annotations

from typing import Any

import torch

from cuvil.frontend.numbers import NumberProxy
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.tracer import Tracer
from cuvil_ir.graph_ir.aliases import Alias, output_aliases
from cuvil_ir.graph_ir.nodes import Graph, Value


def settle(tracer: Tracer, outputs: list[Value], leaves: list[Any]) -> None:
    """Make ``outputs`` (the graph's, in order; ``leaves[i]`` the traced object output
    ``i`` came from, None where unknown) alias exactly where eager's results do."""
    _add_shared_bases(tracer, outputs, leaves)
    for _ in range(len(outputs) + 1):
        aliases = output_aliases(
            Graph(tracer.name, tuple(tracer.inputs), tuple(tracer.nodes), tuple(outputs), ())
        )
        wrong = [i for i, a in enumerate(aliases) if a is not None and not _eager_alias(tracer, i, a, leaves)]
        if not wrong:
            return
        i = wrong[0]
        leaf = leaves[i]
        fresh = tracer.emit("clone", [leaf if isinstance(leaf, TensorProxy) else tracer.wrap(outputs[i])])
        outputs[i], leaves[i] = fresh._cuvil_value, fresh
    raise AssertionError("output aliasing did not settle")  # each round makes one more output fresh


def _root(p: TensorProxy) -> TensorProxy:
    return p if p._cuvil_base is None else p._cuvil_base


def _through_contiguous(p: TensorProxy) -> bool:
    """``p`` was made, through views of one tensor, by a ``.contiguous()`` call: eager
    returns that tensor itself or a copy, depending on the layout a call passes."""
    root = _root(p)
    seen = 0
    while seen < 10_000:
        made = p.__dict__.get("_cuvil_made")
        if made is None:
            return False
        func, args, kwargs, _ = made
        if func is torch.Tensor.contiguous:
            return True
        parents = [
            a
            for a in (*args, *kwargs.values())
            if isinstance(a, TensorProxy) and a is not p and _root(a) is root
        ]
        if not parents:
            return False
        p = parents[0]
        seen += 1
    return True


def _eager_alias(tracer: Tracer, i: int, a: Alias, leaves: list[Any]) -> bool:
    """Whether eager's result ``i`` is the alias ``a`` the graph says it is."""
    leaf = leaves[i]
    if isinstance(leaf, NumberProxy):
        return True  # a Python number: nothing to alias
    if not isinstance(leaf, TensorProxy) or _through_contiguous(leaf):
        return False
    if a.base == "input":
        root = _root(leaf)
        return root._cuvil_is_input and root._cuvil_value is tracer.inputs[a.index]
    other = leaves[a.index]
    if not isinstance(other, TensorProxy) or _through_contiguous(other):
        return False
    if not a.chain:
        return leaf is other
    return _root(leaf) is _root(other) and not _root(leaf)._cuvil_is_input


def _add_shared_bases(tracer: Tracer, outputs: list[Value], leaves: list[Any]) -> None:
    """Append the fresh tensor two results are views of, when no output is it."""
    groups: dict[int, list[TensorProxy]] = {}
    for leaf in leaves:
        if (
            isinstance(leaf, TensorProxy)
            and leaf._cuvil_base is not None
            and not leaf._cuvil_base._cuvil_is_input
        ):
            groups.setdefault(id(leaf._cuvil_base), []).append(leaf)
    for members in groups.values():
        base = members[0]._cuvil_base
        assert base is not None
        distinct = len({m._cuvil_value for m in members}) > 1
        if distinct and base._cuvil_value not in outputs and tracer.visible(base._cuvil_value):
            outputs.append(base._cuvil_value)
            leaves.append(base)


__all__ = ["settle"]
