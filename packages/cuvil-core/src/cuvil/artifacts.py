"""The compiled variants of a ``cu.compile`` function, and running one.

A :class:`~cuvil.api.CompiledFunction` keeps one :class:`Artifact` per structure key:
the capture and executable (or the reason the call runs eagerly) with what its lookup
compares besides the key (the lifted tensors' metadata, the autocast state).
:class:`ModuleSnapshot` says cheaply whether a compiled module's part of the key may
have changed; :func:`run` calls an artifact's executable with one call's graph inputs
(:func:`graph_inputs`) and rebuilds the caller's result tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cuvil.call_plan import output_leaf
from cuvil.frontend import arg_objects
from cuvil.frontend.capture import Captured, module_state
from cuvil.results import unflatten
from cuvil_ir.graph_ir import in_place
from cuvil_runtime.grad import without_grad
from cuvil_runtime.target import Executable


@dataclass
class Artifact:
    """One compiled variant: what its structure key was, and what runs for it."""

    key: tuple[Any, ...]
    extra: tuple[Any, ...]
    captured: Captured | None  # None: this structure falls back to eager
    executable: Executable | None
    target: str | None
    reason: str | None = None
    #: metadata of the lifted (global/closure/attribute) tensors when compiled
    lifted_keys: tuple[Any, ...] = ()
    #: the argument leaves' names (for recompile reasons)
    names: tuple[str, ...] = ()
    #: the call's autocast state (cuvil/autocast.py); part of the structure key
    amp: tuple[Any, ...] = ()
    #: its fast path (cuvil/fast_path.py), made at its first hit
    fast: Any = None


class ModuleSnapshot:
    """What a module's structure key was computed from, checked by identity per call.

    Walking ``named_parameters()`` on every call costs ~0.2 ms for a BERT layer;
    comparing the same objects again costs a few microseconds: the submodule links
    (a replaced submodule), the training flags, and each parameter/buffer slot's
    tensor, dtype and shape (``.data =`` reassignment keeps the object).
    """

    __slots__ = ("flags", "key", "links", "slots")

    def __init__(self, module: torch.nn.Module, key: tuple[Any, ...]) -> None:
        self.key = key
        mods = list(module.modules())
        self.links = [(m._modules, name, child) for m in mods for name, child in m._modules.items()]
        self.flags = [(m, m.training) for m in mods]
        self.slots = [
            (owner, k, owner[k], owner[k].dtype, owner[k].shape) for _, owner, k in module_state(module)
        ]

    def holds(self) -> bool:
        for d, name, child in self.links:
            if d.get(name) is not child:
                return False
        for m, flag in self.flags:
            if m.training is not flag:
                return False
        for owner, k, t, dtype, shape in self.slots:
            cur = owner.get(k)
            if cur is not t or cur.dtype != dtype or cur.shape != shape:
                return False
        return True


def lifted_keys(c: Captured) -> tuple[Any, ...]:
    return tuple(_tensor_meta(lifted.getter()) for lifted in c.lifted)


def _tensor_meta(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return ("not a tensor", type(t))
    return (t.dtype, t.device, tuple(t.shape))


def lifted_ok(art: Artifact) -> bool:
    if art.captured is None or not art.captured.lifted:
        return True
    return lifted_keys(art.captured) == art.lifted_keys


_CARRIERS: dict[int, torch.Tensor] = {}


def size_carrier(n: int) -> torch.Tensor:
    """The ``(n, 0)`` tensor that brings the size ``n`` into a graph: no elements (nothing
    can write it, its storage is no one's), so one per size serves every call; a decoder's
    step passes dozens (each cache layer's lengths and head counts)."""
    t = _CARRIERS.get(n)
    if t is None:
        t = torch.empty((n, 0), dtype=torch.int64)
        if len(_CARRIERS) < 4096:
            _CARRIERS[n] = t
    return t


def graph_inputs(c: Captured, leaves: list[Any]) -> list[Any]:
    """The graph's inputs for one call: argument leaves, module state, lifted tensors."""
    inputs = []
    for kind, where in c.inputs:
        if kind == "leaf":
            inputs.append(leaves[where])
        elif kind == "size":  # an int as a size symbol: [Note: int attributes are sizes]
            inputs.append(size_carrier(leaves[where]))
        elif kind == "state":
            inputs.append(where[0][where[1]])
        else:
            inputs.append(where())
    return inputs


def run_artifact(art: Artifact, leaves: list[Any], tree: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    c = art.captured
    assert c is not None and art.executable is not None
    # inference on every target: results carry no autograd history
    inputs = graph_inputs(c, leaves)
    if c.written_in_place and in_place.exclusive(inputs, c.written_in_place):
        with in_place.writing(True):  # [Note: updates in place]
            results = without_grad(art.executable, inputs)
    else:
        results = without_grad(art.executable, inputs)
    if c.input_updates:  # argument tensors updated in place (cuvil/frontend/input_writes.py)
        with torch.no_grad():
            for i, j in c.input_updates:
                new = results[j]
                if new is not leaves[i]:  # (written in place: the result is the argument itself)
                    leaves[i].copy_(new)
    if c.write_backs:  # arguments the function changes in place end as in eager
        arg_objects.write_back(c.write_backs, results, leaves, tree)
    out = [_result_leaf(kind, v, results, tree) for kind, v in c.outputs]
    return unflatten(out, c.out_spec)


def _result_leaf(kind: str, v: Any, results: Any, tree: Any) -> Any:
    if kind == "arg":
        return arg_objects.at(tree, v)
    if kind == "object":
        return arg_objects.rebuild(v, results)
    return output_leaf(kind, v, results)
