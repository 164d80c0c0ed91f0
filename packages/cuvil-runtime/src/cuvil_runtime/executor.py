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

Control flow (``if``, ``for``, ``while``; see :mod:`cuvil_ir.graph_ir.ops.control`)
runs its regions' steps in the same environment. Attributes that use a ``for``
loop's index are evaluated per iteration (memoised by the values of their symbols),
and so are those that use a size computed from tensor data (``u0``), which the step
that defines it binds when it runs (see :mod:`cuvil_ir.graph_ir.unbacked`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from cuvil_ir.graph_ir.nodes import KV, AttrValue, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import SCALAR_PYTHON_TYPES, ScalarType, TensorType
from cuvil_ir.graph_ir.unbacked import Binding, defined_symbols
from cuvil_ir.symbolic import dim_str, evaluate, evaluate_bool, symbol

Bindings = Mapping[sympy.Symbol, int]

#: distinct size bindings whose evaluated attributes are remembered per interpreter
_MEMO_SIZE = 64
#: attributes evaluated per loop iteration (and binding) remembered per interpreter
_LOOP_MEMO_SIZE = 4096

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


def evaluate_attr(value: AttrValue, bindings: Bindings) -> Any:
    """``value`` with every size expression replaced by its int (or bool) value."""
    if isinstance(value, sympy.Basic):
        if isinstance(value, _PREDICATES):  # not Boolean: a Symbol is a Boolean to sympy
            return evaluate_bool(value, bindings)
        return evaluate(value, bindings)
    if isinstance(value, tuple):
        return tuple(evaluate_attr(v, bindings) for v in value)
    if isinstance(value, KV):
        return KV(tuple((k, evaluate_attr(v, bindings)) for k, v in value.items))
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
    #: the data-dependent sizes this step binds (see cuvil_ir.graph_ir.unbacked)
    binds: tuple[Binding, ...]
    fn: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    #: attributes without size expressions, ready to pass as they are
    static_attrs: dict[str, Any]
    #: attributes with size expressions, evaluated per binding
    symbolic_attrs: tuple[tuple[str, AttrValue], ...]
    #: slots whose last use is this step (freed right after it, to bound memory)
    frees: tuple[int, ...]
    #: position among all steps, nested ones included (indexes per-binding attributes)
    index: int
    #: when an attribute uses a loop index: every symbol the attributes use, whose
    #: values key the attributes evaluated per iteration
    loop_symbols: tuple[sympy.Symbol, ...]
    #: control-flow ops: ``control(operands, frame)`` runs the regions, returns the results
    control: Callable[[list[Any], _Frame], tuple[Any, ...]] | None


@dataclass(frozen=True, slots=True)
class _Block:
    """A region, prepared: its steps and the slots of its arguments and results."""

    steps: tuple[_Step, ...]
    args: tuple[int, ...]
    results: tuple[int, ...]


class _Frame:
    """One call's state while running steps: the environment, the attributes evaluated
    for this binding, the size bindings, and the loop indices in scope."""

    __slots__ = ("env", "attrs", "bindings", "loop")

    def __init__(
        self, env: list[Any], attrs: list[dict[str, Any]], bindings: Bindings, loop: dict[sympy.Symbol, int]
    ) -> None:
        self.env = env
        self.attrs = attrs
        self.bindings = bindings
        self.loop = loop

    def with_index(self, var: sympy.Symbol, value: int) -> _Frame:
        return _Frame(self.env, self.attrs, self.bindings, {**self.loop, var: value})


def _uses(node: Node) -> list[Value]:
    """The values ``node`` reads: operands, and whatever its regions read or yield."""
    out = list(node.inputs)
    for r in node.regions:
        out.extend(r.results)
        for n in r.nodes:
            out.extend(_uses(n))
    return out


class Interpreter:
    """``Interpreter(graph)(*inputs) -> tuple`` of the graph's outputs, computed eagerly.

    Control-flow ops (``if``, ``for``, ``while``) run their regions here: a region's
    steps live in the same environment as the graph's (every value has one slot),
    so a block reads the values of the blocks around it directly.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._inputs = tuple(self._input_spec(i, v) for i, v in enumerate(graph.inputs))
        self._symbols = graph.symbols
        self._static_only = not self._symbols
        self._all_steps: list[_Step] = []
        # Every value gets a slot in a flat environment list: inputs first, then
        # node outputs (and block arguments) in program order.
        self._num_slots = 0
        top = self._block(graph.inputs, graph.nodes, graph.outputs, {}, frozenset(), f"graph @{graph.name}")
        self._steps = top.steps
        self._outputs = top.results
        self._symbolic_steps = tuple(
            s.index for s in self._all_steps if s.symbolic_attrs and not s.loop_symbols
        )
        self._memo: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        self._loop_memo: dict[tuple[int, ...], dict[str, Any]] = {}

    @property
    def stages(self) -> dict[str, str]:
        """The reference target's one stage: the graph it runs."""
        return {"graph_ir": self.graph.text}

    #: no kernels: every op runs its reference
    kernel_texts: dict[str, dict[str, str]] = {}

    def _block(
        self,
        args: tuple[Value, ...],
        nodes: tuple[Node, ...],
        results: tuple[Value, ...],
        outer: dict[Value, int],
        loop_vars: frozenset[sympy.Symbol],
        what: str,
    ) -> _Block:
        """Prepare one block (the graph itself is the outermost one)."""
        scope = dict(outer)
        local: set[int] = set()
        for v in args:
            scope[v] = local_slot = self._num_slots
            self._num_slots += 1
            local.add(local_slot)
        arg_slots = tuple(scope[v] for v in args)
        last_use: dict[int, int] = {}
        prepared: list[tuple[Node, tuple[_Block, ...], frozenset[sympy.Symbol], frozenset[sympy.Symbol]]] = []
        for k, node in enumerate(nodes):
            for v in node.inputs:
                if v not in scope:
                    raise ValueError(f"{what}: {_where(node)} uses %{v.name} before it is defined")
            before = loop_vars
            inner = loop_vars
            if node.op == "for" and isinstance(node.attr("var"), str):
                inner = loop_vars | {symbol(str(node.attr("var")))}
            # a composite op's region is its decomposition: the executor calls its reference
            runs_regions = "composite" not in REGISTRY.get(node.op).traits
            regions = tuple(
                self._block(r.args, r.nodes, r.results, scope, inner, f"{what}: a region of {_where(node)}")
                for r in (node.regions if runs_regions else ())
            )
            for v in _uses(node):
                if v in scope and scope[v] in local:
                    last_use[scope[v]] = k
            for v in node.outputs:
                scope[v] = out_slot = self._num_slots
                self._num_slots += 1
                local.add(out_slot)
                last_use[out_slot] = k  # an output nobody reads dies where it is made
            prepared.append((node, regions, inner, before))
            # sizes computed from tensor data are bound per call, as loop indices are per
            # iteration: attributes that use them are evaluated when their step runs
            loop_vars = loop_vars | {b.symbol for b in defined_symbols(node, {*self._symbols, *loop_vars})}
        undefined = [v for v in results if v not in scope]
        if undefined:
            verb = "yields" if outer else "returns"
            raise ValueError(f"{what} {verb} %{undefined[0].name}, which no node defines")
        result_slots = tuple(scope[v] for v in results)
        frees: dict[int, list[int]] = {}
        for s, k in last_use.items():
            if s not in result_slots:
                frees.setdefault(k, []).append(s)
        steps = tuple(
            self._step(node, scope, tuple(frees.get(k, ())), regions, before, inner)
            for k, (node, regions, inner, before) in enumerate(prepared)
        )
        return _Block(steps, arg_slots, result_slots)

    def _step(
        self,
        node: Node,
        slot: dict[Value, int],
        frees: tuple[int, ...],
        regions: tuple[_Block, ...],
        loop_vars: frozenset[sympy.Symbol],
        inner_vars: frozenset[sympy.Symbol],
    ) -> _Step:
        op = REGISTRY.get(node.op)
        static: dict[str, Any] = {}
        symbolic: list[tuple[str, AttrValue]] = []
        used: set[sympy.Symbol] = set()
        for name, value in node.attrs:
            if not _has_symbols(value):
                # Constant size expressions (sympy Integers) still reach the op as ints.
                static[name] = evaluate_attr(value, {})
                continue
            syms = _free_symbols(value)
            unbound = syms - set(self._symbols) - loop_vars
            if unbound:
                names = ", ".join(sorted(s.name for s in unbound))
                raise ValueError(
                    f"graph @{self.graph.name}: attribute {name!r} of {_where(node)} uses size symbols "
                    f"{names}, which no graph input binds"
                )
            used |= syms
            symbolic.append((name, value))
        control: Callable[[list[Any], _Frame], tuple[Any, ...]] | None = None
        if regions:
            control = self._control(node, regions, inner_vars - loop_vars)
        step = _Step(
            node=node,
            binds=defined_symbols(node, {*self._symbols, *loop_vars}),
            fn=op.reference,
            inputs=tuple(slot[v] for v in node.inputs),
            outputs=tuple(slot[v] for v in node.outputs),
            static_attrs=static,
            symbolic_attrs=tuple(symbolic),
            frees=frees,
            index=len(self._all_steps),
            loop_symbols=tuple(sorted(used, key=lambda s: s.name)) if used & loop_vars else (),
            control=control,
        )
        self._all_steps.append(step)
        return step

    # -- control flow ----------------------------------------------------------
    def _control(
        self, node: Node, regions: tuple[_Block, ...], new_vars: frozenset[sympy.Symbol]
    ) -> Callable[[list[Any], _Frame], tuple[Any, ...]]:
        where = f"graph @{self.graph.name}: {_where(node)}"
        shape = (len(regions), len(node.inputs), len(node.outputs))
        if node.op == "if" and shape[:2] == (2, 1) and all(len(r.results) == shape[2] for r in regions):
            then, other = regions
            return lambda operands, frame: self._run_if(then, other, operands, frame)
        if node.op == "for" and len(new_vars) == 1 and shape[0] == 1 and shape[1] >= 3:
            (body,) = regions
            (var,) = new_vars
            return lambda operands, frame: self._run_for(body, var, operands, frame)
        if node.op == "while" and shape[0] == 2:
            cond, body = regions
            return lambda operands, frame: self._run_while(cond, body, operands, frame)
        raise NotImplementedError(
            f"{where} has {len(regions)} regions; this executor runs only well-formed if, for and while "
            "(verify the graph)"
        )

    def _run_if(self, then: _Block, other: _Block, operands: list[Any], frame: _Frame) -> tuple[Any, ...]:
        block = then if bool(operands[0]) else other
        self._run(block.steps, frame)
        env = frame.env
        return tuple(env[s] for s in block.results)

    def _run_for(
        self, body: _Block, var: sympy.Symbol, operands: list[Any], frame: _Frame
    ) -> tuple[Any, ...]:
        start, stop, step = operands[:3]
        carried = operands[3:]
        env = frame.env
        for i in range(start, stop, step):
            for s, x in zip(body.args, carried):
                env[s] = x
            self._run(body.steps, frame.with_index(var, i))
            carried = [env[s] for s in body.results]
        return tuple(carried)

    def _run_while(self, cond: _Block, body: _Block, operands: list[Any], frame: _Frame) -> tuple[Any, ...]:
        carried = operands
        env = frame.env
        while True:
            for s, x in zip(cond.args, carried):
                env[s] = x
            self._run(cond.steps, frame)
            if not bool(env[cond.results[0]]):
                break
            for s, x in zip(body.args, carried):
                env[s] = x
            self._run(body.steps, frame)
            carried = [env[s] for s in body.results]
        return tuple(carried)

    @staticmethod
    def _input_spec(index: int, v: Value) -> _Input:
        t = v.type
        if isinstance(t, TensorType):
            return _Input(index, v, t.dtype.torch, tuple(t.shape), ())
        assert isinstance(t, ScalarType)
        return _Input(index, v, None, (), SCALAR_PYTHON_TYPES[t.kind])

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
        self._run(self._steps, _Frame(env, attrs, bindings, {}))
        return tuple(env[s] for s in self._outputs)

    def _run(self, steps: tuple[_Step, ...], frame: _Frame) -> None:
        env, attrs = frame.env, frame.attrs
        for step in steps:
            if step.loop_symbols:
                kwargs = self._loop_attrs(step, frame)
            else:
                kwargs = attrs[step.index] if step.symbolic_attrs else step.static_attrs
            try:
                if step.control is None:
                    result = step.fn(*[env[s] for s in step.inputs], **kwargs)
                else:
                    result = step.control([env[s] for s in step.inputs], frame)
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
            for b in step.binds:
                x = env[outs[b.output]]
                frame.loop[b.symbol] = int(x) if b.dim is None else int(x.shape[b.dim])
            for s in step.frees:
                env[s] = None

    def _loop_attrs(self, step: _Step, frame: _Frame) -> dict[str, Any]:
        """The attributes of a step that uses a loop index, for the current iteration."""
        loop, bindings = frame.loop, frame.bindings
        values = tuple(loop[s] if s in loop else bindings[s] for s in step.loop_symbols)
        key = (step.index, *values)
        kwargs = self._loop_memo.get(key)
        if kwargs is None:
            exact = {s: sympy.Integer(v) for s, v in zip(step.loop_symbols, values)}
            kwargs = dict(step.static_attrs)
            for name, value in step.symbolic_attrs:
                try:
                    kwargs[name] = evaluate_attr(value, exact)
                except ValueError as e:
                    raise ValueError(f"{_where(step.node)}: attribute {name!r}: {e}") from e
            if len(self._loop_memo) >= _LOOP_MEMO_SIZE:
                self._loop_memo.clear()
            self._loop_memo[key] = kwargs
        return kwargs

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
            attrs = [{}] * len(self._all_steps)  # only symbolic steps read theirs
            for k in self._symbolic_steps:
                step = self._all_steps[k]
                kwargs = dict(step.static_attrs)
                for name, value in step.symbolic_attrs:
                    try:
                        kwargs[name] = evaluate_attr(value, exact)
                    except ValueError as e:
                        raise ValueError(f"{_where(step.node)}: attribute {name!r}: {e}") from e
                attrs[k] = kwargs
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = attrs
        return attrs


__all__ = ["AssumptionError", "Interpreter", "evaluate_attr"]
