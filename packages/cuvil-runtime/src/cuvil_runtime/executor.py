"""The reference executor: runs a Graph IR graph op by op with each op's ``reference``.

This is Cuvil's correctness oracle, so it does the simplest thing that is
obviously right: eager torch calls in program order. Everything that does not
depend on the input values is worked out once, in the constructor (the op of
each node, the slots its operands live in, which attributes hold size
expressions, when each value dies), so a call is a tight loop over prepared
steps.

Size symbols are bound from the input tensors' sizes on every call; attribute
size expressions and the graph's assumptions are evaluated once per distinct
binding and memoised, since a program usually runs at a handful of sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, TensorType
from cuvil_ir.symbolic import dim_str, evaluate, evaluate_bool

Bindings = Mapping[sympy.Symbol, int]

#: distinct size bindings whose evaluated attributes are remembered per interpreter
_MEMO_SIZE = 64

_SCALAR_KINDS: dict[ScalarKind, tuple[type, ...]] = {
    ScalarKind.bool: (bool,),
    ScalarKind.int: (int,),
    ScalarKind.float: (float, int),
}


_PREDICATES = (sympy.Rel, sympy.logic.boolalg.BooleanFunction, sympy.logic.boolalg.BooleanAtom)


class AssumptionError(ValueError):
    """The inputs violate a size fact the graph was built under (a failed guard)."""


def _where(node: Node) -> str:
    return f"{node.op} at {node.loc}" if node.loc else node.op


def _add_note(e: BaseException, note: str) -> None:
    # BaseException.add_note exists from Python 3.11 on; 3.10 keeps the bare error.
    add_note = getattr(e, "add_note", None)
    if add_note is not None:
        add_note(note)


def _has_symbols(value: AttrValue) -> bool:
    if isinstance(value, sympy.Basic):
        return bool(value.free_symbols)
    if isinstance(value, tuple):
        return any(_has_symbols(v) for v in value)
    if isinstance(value, KV):
        return any(_has_symbols(v) for _, v in value.items)
    return False


def _free_symbols(value: AttrValue) -> set[sympy.Symbol]:
    if isinstance(value, sympy.Basic):
        return {s for s in value.free_symbols if isinstance(s, sympy.Symbol)}
    if isinstance(value, tuple):
        return set().union(*(_free_symbols(v) for v in value))
    if isinstance(value, KV):
        return set().union(*(_free_symbols(v) for _, v in value.items))
    return set()


def _exact(bindings: Bindings) -> dict[sympy.Symbol, sympy.Integer]:
    # Bind to sympy Integers, not ints: ``B.xreplace({B: 2})`` returns the bare int 2,
    # which cuvil_ir.symbolic.evaluate then cannot inspect.
    return {s: sympy.Integer(v) for s, v in bindings.items()}


def _evaluate_attr(value: AttrValue, bindings: Bindings) -> Any:
    """``value`` with every size expression replaced by its int (or bool) value."""
    if isinstance(value, sympy.Basic):
        if isinstance(value, _PREDICATES):  # not Boolean: a Symbol is a Boolean to sympy
            return evaluate_bool(value, bindings)
        return evaluate(value, bindings)
    if isinstance(value, tuple):
        return tuple(_evaluate_attr(v, bindings) for v in value)
    if isinstance(value, KV):
        return KV(tuple((k, _evaluate_attr(v, bindings)) for k, v in value.items))
    return value


@dataclass(frozen=True, slots=True)
class _Input:
    """How to check graph input ``index`` and which size symbols it binds."""

    index: int
    value: Value
    #: tensors: expected torch dtype and per-dim (static size | symbol | other expr)
    dtype: torch.dtype | None
    dims: tuple[int | sympy.Expr, ...]
    #: scalars: accepted Python types
    scalar_types: tuple[type, ...]

    def describe(self) -> str:
        return f"input {self.index} (%{self.value.name}: {self.value.type})"


@dataclass(frozen=True, slots=True)
class _Step:
    node: Node
    fn: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    #: attributes without size expressions, ready to pass as they are
    static_attrs: dict[str, Any]
    #: attributes with size expressions, evaluated per binding
    symbolic_attrs: tuple[tuple[str, AttrValue], ...]
    #: slots whose last use is this step (freed right after it, to bound memory)
    frees: tuple[int, ...]


class Interpreter:
    """``Interpreter(graph)(*inputs) -> tuple`` of the graph's outputs, computed eagerly."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        for node in graph.walk():
            if node.regions:
                raise NotImplementedError(
                    f"graph @{graph.name}: {_where(node)} has regions; control-flow ops are not "
                    "supported by this executor yet"
                )
        self._inputs = tuple(self._input_spec(i, v) for i, v in enumerate(graph.inputs))
        self._symbols = graph.symbols
        self._static_only = not self._symbols

        # Every value gets a slot in a flat environment list: inputs first, then
        # node outputs in program order.
        slot: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}
        last_use: dict[int, int] = {}
        for k, node in enumerate(graph.nodes):
            for v in node.inputs:
                if v not in slot:
                    raise ValueError(
                        f"graph @{graph.name}: {_where(node)} uses %{v.name} before it is defined"
                    )
                last_use[slot[v]] = k
            for v in node.outputs:
                slot[v] = len(slot)
                last_use[slot[v]] = k  # an output nobody reads dies where it is made
        undefined = [v for v in graph.outputs if v not in slot]
        if undefined:
            raise ValueError(f"graph @{graph.name} returns %{undefined[0].name}, which no node defines")
        self._outputs = tuple(slot[v] for v in graph.outputs)
        frees: dict[int, list[int]] = {}
        for s, k in last_use.items():
            if s not in self._outputs:
                frees.setdefault(k, []).append(s)
        self._steps = tuple(
            self._step(node, slot, tuple(frees.get(k, ()))) for k, node in enumerate(graph.nodes)
        )
        self._num_slots = len(slot)
        self._symbolic_steps = tuple(k for k, s in enumerate(self._steps) if s.symbolic_attrs)
        self._memo: dict[tuple[int, ...], list[dict[str, Any]]] = {}

    def _step(self, node: Node, slot: dict[Value, int], frees: tuple[int, ...]) -> _Step:
        op = REGISTRY.get(node.op)
        static: dict[str, Any] = {}
        symbolic: list[tuple[str, AttrValue]] = []
        for name, value in node.attrs:
            if not _has_symbols(value):
                # Constant size expressions (sympy Integers) still reach the op as ints.
                static[name] = _evaluate_attr(value, {})
                continue
            unbound = _free_symbols(value) - set(self._symbols)
            if unbound:
                names = ", ".join(sorted(s.name for s in unbound))
                raise ValueError(
                    f"graph @{self.graph.name}: attribute {name!r} of {_where(node)} uses size symbols "
                    f"{names}, which no graph input binds"
                )
            symbolic.append((name, value))
        return _Step(
            node=node,
            fn=op.reference,
            inputs=tuple(slot[v] for v in node.inputs),
            outputs=tuple(slot[v] for v in node.outputs),
            static_attrs=static,
            symbolic_attrs=tuple(symbolic),
            frees=frees,
        )

    @staticmethod
    def _input_spec(index: int, v: Value) -> _Input:
        t = v.type
        if isinstance(t, TensorType):
            return _Input(index, v, t.dtype.torch, tuple(t.shape), ())
        assert isinstance(t, ScalarType)
        return _Input(index, v, None, (), _SCALAR_KINDS[t.kind])

    # -- per call --------------------------------------------------------------
    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        if len(inputs) != len(self._inputs):
            names = ", ".join(f"%{i.value.name}" for i in self._inputs)
            raise TypeError(
                f"graph @{self.graph.name} takes {len(self._inputs)} inputs ({names}), got {len(inputs)}"
            )
        bindings = self._bind(inputs)
        attrs = self._attrs_for(bindings)

        env: list[Any] = [None] * self._num_slots
        env[: len(inputs)] = inputs
        for k, step in enumerate(self._steps):
            kwargs = attrs[k] if step.symbolic_attrs else step.static_attrs
            try:
                result = step.fn(*[env[s] for s in step.inputs], **kwargs)
            except Exception as e:
                _add_note(
                    e, f"while running {_where(step.node)} in graph @{self.graph.name} (reference executor)"
                )
                raise
            outs = step.outputs
            if isinstance(result, tuple):
                if len(result) != len(outs):
                    raise RuntimeError(
                        f"{_where(step.node)}: reference returned {len(result)} values for {len(outs)} outputs"
                    )
                for s, r in zip(outs, result):
                    env[s] = r
            elif len(outs) == 1:
                env[outs[0]] = result
            else:
                raise RuntimeError(
                    f"{_where(step.node)}: reference returned one value for {len(outs)} outputs"
                )
            for s in step.frees:
                env[s] = None
        return tuple(env[s] for s in self._outputs)

    def _bind(self, inputs: tuple[Any, ...]) -> dict[sympy.Symbol, int]:
        """Check each input against its type; bind size symbols from tensor sizes."""
        bindings: dict[sympy.Symbol, int] = {}
        bound_by: dict[sympy.Symbol, tuple[_Input, int]] = {}
        deferred: list[tuple[_Input, int, int]] = []
        for spec, x in zip(self._inputs, inputs):
            if spec.dtype is None:
                # bool is an int subclass, but promotes differently: keep the kinds apart.
                if not isinstance(x, spec.scalar_types) or (
                    isinstance(x, bool) and bool not in spec.scalar_types
                ):
                    raise TypeError(f"{spec.describe()}: expected a Python scalar, got {type(x).__name__}")
                continue
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{spec.describe()}: expected a tensor, got {type(x).__name__}")
            if x.dim() != len(spec.dims):
                raise TypeError(
                    f"{spec.describe()}: expected a rank-{len(spec.dims)} tensor, got rank {x.dim()} "
                    f"(shape {tuple(x.shape)})"
                )
            if x.dtype != spec.dtype:
                raise TypeError(f"{spec.describe()}: expected dtype {spec.dtype}, got {x.dtype}")
            for axis, (want, got) in enumerate(zip(spec.dims, x.shape)):
                if isinstance(want, int):
                    if want != got:
                        raise ValueError(f"{spec.describe()}: dim {axis} must be {want}, got {got}")
                elif isinstance(want, sympy.Symbol):
                    if want in bindings:
                        if bindings[want] != got:
                            first, first_axis = bound_by[want]
                            raise ValueError(
                                f"size symbol {want} is {bindings[want]} in {first.describe()} dim {first_axis} "
                                f"but {got} in {spec.describe()} dim {axis}; these sizes must be equal"
                            )
                    else:
                        bindings[want] = int(got)
                        bound_by[want] = (spec, axis)
                else:
                    deferred.append((spec, axis, int(got)))
        # The verifier only admits ints and symbols on inputs; other expressions are
        # still honoured, once every symbol has a value.
        for spec, axis, got in deferred:
            want = evaluate(spec.dims[axis], _exact(bindings))
            if want != got:
                raise ValueError(
                    f"{spec.describe()}: dim {axis} must be {dim_str(spec.dims[axis])} = {want}, got {got}"
                )
        return bindings

    def _attrs_for(self, bindings: dict[sympy.Symbol, int]) -> list[dict[str, Any]]:
        """Per step, its attributes with size expressions evaluated; checks assumptions."""
        if self._static_only:
            return []
        key = tuple(bindings[s] for s in self._symbols)
        attrs = self._memo.get(key)
        if attrs is None:
            exact = _exact(bindings)
            for fact in self.graph.assumptions:
                if not evaluate_bool(fact, exact):
                    sizes = ", ".join(
                        f"{s}={v}" for s, v in sorted(bindings.items(), key=lambda kv: kv[0].name)
                    )
                    raise AssumptionError(
                        f"graph @{self.graph.name} was built assuming {sympy.sstr(fact)}, which does not hold "
                        f"for these inputs ({sizes}); capture it again for these sizes"
                    )
            attrs = [{} for _ in self._steps]
            for k in self._symbolic_steps:
                step = self._steps[k]
                kwargs = dict(step.static_attrs)
                for name, value in step.symbolic_attrs:
                    try:
                        kwargs[name] = _evaluate_attr(value, exact)
                    except ValueError as e:
                        raise ValueError(f"{_where(step.node)}: attribute {name!r}: {e}") from e
                attrs[k] = kwargs
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = attrs
        return attrs


__all__ = ["AssumptionError", "Interpreter"]
