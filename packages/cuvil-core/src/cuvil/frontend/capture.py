"""Capture one call of a function or module as a Graph IR graph.

The argument tree is flattened; tensor leaves become graph inputs with symbolic
sizes (``dynamic=True``: ``x_0``, ``x_1`` ... named after the parameter and
axis), other leaves stay Python values (specialised, guarded by value). For a
module, parameters and buffers become graph inputs too: they are swapped for
proxies in the module for the duration of the trace, so the graph reads them at
call time instead of baking them in.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil import autocast
from cuvil.errors import CompileError
from cuvil.frontend import (
    aliasing,
    arg_objects,
    attribute_reads,
    builtin_args,
    compiling,
    hooks,
    impure,
    input_writes,
    layout,
    object_state,
)
from cuvil.frontend.arg_objects import WriteBack
from cuvil.frontend.convert import ConversionError, convert, is_user_function
from cuvil.frontend.locations import trace_entry
from cuvil.frontend.numbers import NumberProxy
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.reads import LiftSource
from cuvil.frontend.regions import Undefined
from cuvil.frontend.tracer import Lifted, Tracer
from cuvil.guards import _SCALARS, AssumptionCheck, ReadGuards, SymbolSlot
from cuvil_ir.graph_ir import in_place
from cuvil_ir.graph_ir.nodes import Graph, Value
from cuvil_ir.graph_ir.verifier import verify

# How a graph input is fetched on each call: ("leaf", index) into the flattened
# arguments, ("state", (dict, key)) a parameter/buffer slot of the module, or
# ("lifted", getter) a global/closure/constant tensor.
InputPlan = list[tuple[str, Any]]


@dataclass
class Captured:
    graph: Graph
    inputs: InputPlan
    check: AssumptionCheck
    out_spec: pytree.TreeSpec
    #: per output leaf: ("graph", i) for graph output i, ("item", i) for the Python number
    #: graph output i holds as a 0-d tensor, ("const", value), ("arg", path) the caller's
    #: argument object at that path, or ("object", skeleton) an object rebuilt per call
    #: ([Note: objects in the argument tree])
    outputs: list[tuple[str, Any]]
    lifted: list[Lifted]
    #: the globals, closure variables and attributes the traced code read
    guards: ReadGuards
    #: the source files of the code the capture ran (cuvil/warm.py)
    files: frozenset[str] = frozenset()
    #: whether another process may reuse this capture (no side effect such as a print)
    storable: bool = True
    #: arguments the function changed in place, written back after each run
    write_backs: tuple[WriteBack, ...] = ()
    #: argument tensors updated in place: (leaf index, graph output of the final value),
    #: copied into the caller's tensor after each run (cuvil/frontend/input_writes.py)
    input_updates: tuple[tuple[int, int], ...] = ()
    #: graph inputs (of ``input_updates``) that calls marked ``in_place`` write directly when
    #: no other input shares their storage ([Note: updates in place])
    written_in_place: tuple[int, ...] = ()


def module_state(module: torch.nn.Module) -> list[tuple[str, dict[str, Any], str]]:
    """Every (graph input name, owning dict, key) of the module's parameters and buffers.

    Tied tensors appear once, under their first name; all their slots are swapped.
    """
    out = []
    seen: set[int] = set()
    for kind, named in (("_parameters", module.named_parameters()), ("_buffers", module.named_buffers())):
        for name, t in named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            owner_path, _, key = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            out.append((f"self.{name}", getattr(owner, kind), key))
    return out


def _all_state_slots(module: torch.nn.Module) -> list[tuple[dict[str, Any], str]]:
    slots = []
    for m in module.modules():
        for d in (m._parameters, m._buffers):
            for k, v in d.items():
                if v is not None:
                    slots.append((d, k))
    return slots


def _lift_sources(fn: Any, module: torch.nn.Module | None) -> dict[int, LiftSource]:
    """Names and getters for tensors the function may reach besides its arguments:
    closure cells of the root function and tensor attributes of the module (globals
    of any user frame are found when lifting, see ``Tracer.lift``)."""
    out: dict[int, LiftSource] = {}
    raw = getattr(fn, "__func__", fn)
    code = getattr(raw, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, raw.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, torch.Tensor):
                out.setdefault(
                    id(v),
                    (f"closure.{name}", functools.partial(getattr, cell, "cell_contents"), ("closure", name)),
                )
    if module is not None:
        for path, m in module.named_modules():
            for attr, v in vars(m).items():
                if isinstance(v, torch.Tensor) and not attr.startswith("_"):
                    full = f"self.{path + '.' if path else ''}{attr}"
                    out.setdefault(
                        id(v), (full, functools.partial(getattr, m, attr), ("attr", ("self", path), attr))
                    )
    return out


def _guard_defaults(tracer: Tracer, fn: Any, module: torch.nn.Module | None) -> None:
    """The compiled function's default values are read by the call itself ([Note: calls
    are replayed as made] in cuvil/api.py), so they are guarded like any other read:
    assigning ``f.__defaults__`` recompiles."""
    place: tuple[Any, ...]
    if module is not None:
        owner, name, place = type(module).forward, "forward", ("attr", ("self", ""), "forward")
    else:
        owner, name, place = fn, getattr(fn, "__qualname__", "fn"), ("root",)
    for attr in ("__defaults__", "__kwdefaults__"):
        value = getattr(owner, attr, None)
        if value:
            getter = functools.partial(getattr, owner, attr)
            tracer.reads.read(
                f"the defaults of {name}", f"{name}.{attr}", name, getter, value, ("attr", place, attr)
            )


def root_callable(fn: Any, module: torch.nn.Module | None) -> Callable[..., Any]:
    """The converted function (or bound forward) to run on proxies."""
    if module is not None:
        forward = type(module).forward
        if not is_user_function(forward):
            return module
        try:
            converted = types.MethodType(convert(forward, hooks), module)
        except ConversionError:
            return module
        return hooks.with_hooks(module, converted) if object_state.has_hooks(module) else converted
    if is_user_function(fn):
        try:
            return convert(fn, hooks)
        except ConversionError:
            return fn  # type: ignore[no-any-return]
    if isinstance(fn, types.MethodType) and is_user_function(fn.__func__):
        # converted, so its reads of the object (self.k) go through the guarded hooks
        try:
            return types.MethodType(convert(fn.__func__, hooks), fn.__self__)
        except ConversionError:
            return fn
    return fn  # type: ignore[no-any-return]


@trace_entry
def capture(
    name: str,
    fn: Any,
    module: torch.nn.Module | None,
    leaves: Sequence[Any],
    leaf_names: Sequence[str],
    spec: pytree.TreeSpec,
    dynamic: bool,
    dims: dict[str, dict[int, str | None]] | None = None,
) -> Captured:
    tracer = Tracer(name, _lift_sources(fn, module))
    raw = getattr(fn, "__func__", fn)
    code = getattr(raw, "__code__", None)
    if code is not None and module is None:
        tracer.reads.root_cells = {id(c): n for n, c in zip(code.co_freevars, raw.__closure__ or ())}
    plan: InputPlan = []
    slots: list[SymbolSlot] = []
    fixed: list[tuple[int, int, int, str]] = []
    traced_leaves: list[Any] = []
    for i, (leaf, lname) in enumerate(zip(leaves, leaf_names)):
        if isinstance(leaf, torch.Tensor):
            names = (dims or {}).get(lname) or {}
            named: dict[int, str] = {a: n for a, n in names.items() if n is not None}
            p = tracer.add_input(lname, leaf, symbolic=dynamic, dim_names=named)
            if dynamic and len(named) < len(names):
                _static_dims(tracer, p, leaf, i, lname, [a for a, n in names.items() if n is None], fixed)
            layout.note_argument(p, i, lname, leaf)
            plan.append(("leaf", i))
            for axis, d in enumerate(p.ir_type.shape):
                if not isinstance(d, int):
                    slots.append(SymbolSlot(d, i, axis, lname))  # type: ignore[arg-type]
            traced_leaves.append(p)
        elif type(leaf) is arg_objects.SizeArg:  # [Note: int attributes are sizes]
            s, value = tracer.add_size_input(lname, int(leaf))
            plan.append(("size", i))
            slots.append(SymbolSlot(s, i, -1, lname))
            traced_leaves.append(value)
        else:
            traced_leaves.append(leaf)
            if not isinstance(leaf, _SCALARS):  # guarded by identity in the structure key
                arg_objects.check_leaf(leaf, lname)
                tracer.reads.long_lived(leaf, lname)
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    try:
        if module is not None:
            by_id: dict[int, TensorProxy] = {}
            for gname, owner, key in module_state(module):
                t = owner[key]
                by_id[id(t)] = tracer.add_input(gname, t, symbolic=False)
                plan.append(("state", (owner, key)))
            for owner, key in _all_state_slots(module):
                swapped.append((owner, key, owner[key]))
                owner[key] = by_id[id(owner[key])]
        args, kwargs = pytree.tree_unflatten(traced_leaves, spec)
        # the argument objects the function gets, alive until the end (ids are compared)
        arg_nodes = list(arg_objects.nodes((args, kwargs)))
        before = {path: _Snapshot(node) for path, node in arg_nodes if len(path) == 2}
        target = root_callable(fn, module)
        _guard_defaults(tracer, fn, module)
        impure.default_dtype(tracer.reads)  # factories and number promotion read it
        tracer.reads.add_file(getattr(getattr(target, "__func__", target), "__code__", None))
        if module is not None:  # its submodule links are guarded by the module snapshot
            for path, sub in module.named_modules():
                tracer.reads.long_lived(sub, f"self.{path}" if path else "self", place=("self", path))
                tracer.reads.snapshotted.add(id(sub))
                # library modules' forwards run as they are: their files count too
                tracer.reads.add_file(getattr(type(sub).forward, "__code__", None))
        else:
            if target is fn:  # not converted (a lambda, no source): guard what its code names
                tracer.reads.code(getattr(fn, "__func__", fn))
            if isinstance(fn, types.MethodType):
                # a bound method's object is the same on every call: what the method reads
                # from it is guarded (converted code reads self.k through the attribute hook)
                tracer.reads.long_lived(fn.__self__, "self")
        recorded = _recorded_modules(fn, module)
        with (
            attribute_reads.recording(recorded) as tracer.reads.attribute_reads,
            tracer.tracing(),
            layout.mode(tracer),
            _compiling(),
            builtin_args.decided(),
            autocast.kept(),  # an autocast the function entered and did not leave ends here
        ):
            out = target(*args, **kwargs)
    finally:
        for owner, key, original in reversed(swapped):
            owner[key] = original
    tracer.reads.module_states()  # what modules hold that no read hook saw
    path_of = {id(node): path for path, node in arg_nodes}

    def output(value: Any) -> int:
        outputs.append(tracer.value_of(value))
        returned.append(value)
        return len(outputs) - 1

    out_leaves, out_spec = pytree.tree_flatten(out, is_leaf=lambda x: id(x) in path_of)
    outputs: list[Value] = []
    returned: list[Any] = []  # what each output came from (cuvil/frontend/aliasing.py)
    out_plan: list[tuple[str, Any]] = []
    for leaf in out_leaves:
        if isinstance(leaf, Undefined):
            leaf._fail()
        if id(leaf) in path_of:
            out_plan.append(("arg", path_of[id(leaf)]))
        elif isinstance(leaf, torch.SymBool):
            out_plan.append(("const", bool(leaf)))
        elif isinstance(leaf, NumberProxy):  # a Python number only known at run time
            out_plan.append(("item", len(outputs)))
            outputs.append(tracer.value_of(leaf))
            returned.append(leaf)
        elif isinstance(leaf, (torch.Tensor, torch.SymInt, torch.SymFloat)):
            out_plan.append(("graph", len(outputs)))
            outputs.append(tracer.value_of(leaf))
            returned.append(leaf)
        else:
            # an object holding traced values is rebuilt per call ([Note: objects in the argument tree])
            skeleton = None if isinstance(leaf, _SCALARS) else arg_objects.template(leaf, output)
            out_plan.append(("const", leaf) if skeleton is None else ("object", skeleton))
    write_backs = _write_backs(tracer, arg_nodes, before, traced_leaves, outputs, spec, fn, module, returned)
    updates = input_writes.plan(tracer, traced_leaves, outputs, returned)
    aliasing.settle(tracer, outputs, returned)
    for lifted in tracer.lifted:
        plan.append(("lifted", lifted.getter))
    graph = tracer.graph(outputs)
    # the graph inputs of the argument tensors updated: written in place where [Note:
    # updates in place] allows (checked again per call: cuvil/artifacts.py)
    leaf_input = {where: k for k, (kind, where) in enumerate(plan) if kind == "leaf"}
    graph, written = in_place.mark(graph, [leaf_input[i] for i, _ in updates if i in leaf_input])
    try:
        verify(graph)
    except Exception as e:
        raise CompileError(f"internal error: the captured graph does not verify: {e}") from e
    check = AssumptionCheck(graph.assumptions, slots, tracer.ctx.reasons, layout.guards(tracer), fixed)
    return Captured(
        graph,
        plan,
        check,
        out_spec,
        out_plan,
        tracer.lifted,
        ReadGuards(tracer.reads.guards),
        frozenset(tracer.reads.files),
        tracer.reads.storable,
        tuple(write_backs),
        updates,
        written,
    )


def _recorded_modules(fn: Any, module: torch.nn.Module | None) -> list[torch.nn.Module]:
    """The modules whose attribute reads the capture records: those of the compiled
    module's tree (or a compiled method's module) whose code runs unconverted
    ([Note: recorded attribute reads])."""
    root = module if module is not None else getattr(fn, "__self__", None)
    if not isinstance(root, torch.nn.Module):
        return []
    return [m for m in root.modules() if object_state.runs_unconverted(m)]


def _static_dims(
    tracer: Tracer,
    p: TensorProxy,
    leaf: torch.Tensor,
    index: int,
    name: str,
    axes: Sequence[int],
    fixed: list[tuple[int, int, int, str]],
) -> None:
    """The dims ``dims`` names ``None`` keep the example's sizes under ``dynamic=True``
    (the torch.compile backend: the sizes Dynamo keeps static): the input is retyped
    before any use, and each such size is guarded per call (``AssumptionCheck.fixed``)."""
    rank = leaf.dim()
    static = sorted({a % rank for a in axes}) if rank else []
    t = p.ir_type
    shape = tuple(int(leaf.shape[a]) if a in static else d for a, d in enumerate(t.shape))
    v = Value(p._cuvil_value.name, t.replace(shape=shape))
    assert tracer.inputs[-1] is p._cuvil_value
    tracer.inputs[-1] = v
    p._cuvil_value = v
    fixed.extend((index, a, int(leaf.shape[a]), name) for a in static)


def _write_backs(
    tracer: Tracer,
    arg_nodes: list[tuple[tuple[int, ...], Any]],
    before: dict[tuple[int, ...], _Snapshot],
    traced_leaves: list[Any],
    outputs: list[Value],
    spec: pytree.TreeSpec,
    fn: Any,
    module: Any,
    returned: list[Any],
) -> list[WriteBack]:
    """The arguments the function changed in place, their new leaves appended to
    ``outputs`` ([Note: objects in the argument tree], rule 3)."""
    input_index = {id(p): i for i, p in enumerate(traced_leaves) if isinstance(p, TensorProxy)}
    out = []
    for path, node in arg_nodes:
        if path not in before or before[path] == _Snapshot(node):
            continue
        name = _arg_name(path, spec, fn, module)
        arg_objects.check_syncable(node, name)
        new_leaves, new_spec = arg_objects.flatten(node)
        if arg_objects.has_objects(new_spec):
            after, rebuilt = _rebuilt_state(tracer, node, new_leaves, new_spec)
            arg_objects.check_changed(after, rebuilt, name, type(node).__name__)
        plan: list[tuple[str, Any]] = []
        for leaf in new_leaves:
            if id(leaf) in input_index:  # unchanged: the caller's own tensor, as in eager
                plan.append(("leaf", input_index[id(leaf)]))
            elif isinstance(leaf, (torch.Tensor, torch.SymInt, torch.SymFloat)):
                plan.append(("graph", len(outputs)))
                outputs.append(tracer.value_of(leaf))
                returned.append(leaf)
            else:
                arg_objects.check_plain(leaf, f"a new value in argument {name}")
                plan.append(("const", leaf))
        out.append(
            WriteBack(path, name, new_spec, tuple(plan), arg_objects.leaf_places(new_spec, spec, path))
        )
    return out


def _rebuilt_state(
    tracer: Tracer, node: Any, leaves: list[Any], spec: pytree.TreeSpec
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The state of ``node`` and of the object rebuilt from its leaves, rebuilt under the
    tracer (what unflatten computes is dead code in the graph)."""
    with tracer.tracing(), tracer.mode():
        return arg_objects.state(node), arg_objects.state(pytree.tree_unflatten(leaves, spec))


def _compiling() -> contextlib.AbstractContextManager[Any]:
    """``torch.compiler.is_compiling()`` is true while a capture runs the function.

    [Note: captures count as compiling] Libraries ask ``torch.compiler.is_compiling()``
    to leave out what a graph compiler cannot capture and does not need: Python checks
    on tensor data (transformers' packed-sequence test ``(mask[:, -1] == 0).all()``),
    eager-only fast paths (``nn.TransformerEncoderLayer``'s fused kernel). Both paths give
    the same results (torch.compile and torch.export rely on that); the compile path is
    the one a capture can follow. torch.export sets the same flag for its non-strict
    tracing; like there, it is process-wide while the capture runs (captures overlapping in
    two threads included: cuvil/frontend/compiling.py).
    """
    return compiling.session()


class _Snapshot:
    """How an argument flattens, and the state of the registered objects in it: equal
    when the function left it alone (the same leaf objects, a changed counter being a new
    int and a grown cache a new tensor; state the flatten does not hold changed too)."""

    def __init__(self, node: Any) -> None:
        self.leaves, self.spec = arg_objects.flatten(node)
        self.state = arg_objects.state(node) if arg_objects.has_objects(self.spec) else None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Snapshot)
            and self.spec == other.spec
            and all(
                x is y or (type(x) is type(y) and _scalar_eq(x, y)) for x, y in zip(self.leaves, other.leaves)
            )
            and self.state == other.state
        )

    __hash__ = None  # type: ignore[assignment]


def _scalar_eq(x: Any, y: Any) -> bool:
    return isinstance(x, _SCALARS) and x == y


def _arg_name(path: tuple[int, ...], spec: pytree.TreeSpec, fn: Any, module: Any) -> str:
    """The top-level argument at ``path``: ``(0, i)`` positional, ``(1, j)`` keyword."""
    if path[0] == 1:
        return str(spec.child(1).context[path[1]])
    try:
        params = list(
            inspect.signature(type(module).forward if module is not None else fn).parameters.values()
        )
    except (TypeError, ValueError):
        params = []
    params = [p for p in params[1 if module is not None else 0 :] if p.kind is not p.VAR_POSITIONAL]
    return params[path[1]].name if path[1] < len(params) else f"#{path[1]}"
