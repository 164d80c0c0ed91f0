"""The tracer: records torch-level calls on proxies into Graph IR.

Why torch-function level (see docs/architecture.md, "Capture"): it sees the
calls users write (``F.layer_norm``, ``torch.softmax``, ``x @ w``) before they
are decomposed, which are the ops worth fusing; it needs no bytecode and no
``torch._dynamo``; and ``TorchFunctionMode`` also sees factory calls without
tensor arguments. Shapes are ours (sympy, via each op's rule); only calls
without a declaration use torch's fake kernels (extern nodes).

The tracer holds all of a capture's recording state ([Note: tracer checkpoints]);
its helpers hold none: what a call is (``torch_calls``), attribute encoding
(``attributes``), source locations (``locations``), dead code (``dead_code``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cuvil import autocast
from cuvil.errors import CompileError, SourceLoc
from cuvil.frontend import data_sizes, decompose, locations, metadata, torch_calls
from cuvil.frontend.attributes import INDEXING, UnrecordableArgument, argument_tree, attribute, mask_lists
from cuvil.frontend.checkpoint import Checkpoint, restore
from cuvil.frontend.convert import is_user_frame
from cuvil.frontend.dead_code import eliminate_dead_code
from cuvil.frontend.proxy import TensorProxy
from cuvil.frontend.reads import LiftSource, Reads, global_place
from cuvil.frontend.torch_calls import SYM
from cuvil.frontend.tracer_view import LayoutGuard
from cuvil_ir.graph_ir.fake import FakeInferenceError, SymMirror, fake_call
from cuvil_ir.graph_ir.nodes import AttrValue, Block, Graph, Loc, Node, Value
from cuvil_ir.graph_ir.ops import ShapeError
from cuvil_ir.graph_ir.registry import REGISTRY, NotCaptured, infer_types
from cuvil_ir.graph_ir.torch_names import qualname
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import DataSizeError, ShapeContext, UndecidableError, symbol


@dataclass(frozen=True, slots=True)
class Lifted:
    """A tensor the traced code reached that is not an argument: bound on every call
    through ``getter`` (a global or closure variable, read anew), or by identity."""

    value: Value
    name: str
    getter: Callable[[], Any]
    #: where another process finds it ([Note: places] in cuvil/guards.py), or None
    place: tuple[Any, ...] | None = None


#: the tracer of the capture in progress in this thread or task (:meth:`Tracer.current`)
_CURRENT: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("cuvil_tracer", default=None)


class _Mode(TorchFunctionMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.tracer.handle(func, args, kwargs or {})


class Tracer:
    """Implements :class:`cuvil_ir.Emitter` for capture rules, and the torch-function handler."""

    def __init__(self, name: str, lift_sources: dict[int, LiftSource] | None = None) -> None:
        self.name = name
        self.ctx = ShapeContext(hints={})
        self.mirror = SymMirror(self.ctx)
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.lifted: list[Lifted] = []
        self._lifted_ids: dict[int, TensorProxy] = {}
        self._lift_sources = lift_sources if lift_sources is not None else {}
        #: globals, closure variables and attributes read (see cuvil/frontend/reads.py)
        self.reads = Reads(self._lift_sources)
        #: active converted calls per code object (recursion is unrolled, up to a limit)
        self.depth: dict[types.CodeType, int] = {}
        self._consts: dict[tuple[type, Any], Value] = {}
        self._names: set[str] = set()
        self._counter = 0
        self._positions: dict[types.CodeType, list[Any]] = {}
        self._keepalive: list[Any] = []
        # [Note: region scoping] values defined inside a region (a branch or loop
        # body) are visible only while it is open; _home maps each value to the
        # region that defined it (0: the graph), _open lists the open regions.
        self._home: dict[Value, int] = {}
        self._open: list[int] = [0]
        self._regions = 0
        #: data-dependent size symbols some result already has (bound by an earlier node)
        self.seen_data_sizes: set[sympy.Symbol] = set()
        #: captured loops so far (each binds its own index symbol)
        self.loops = 0
        #: the undeclared calls being decomposed on this tracer, innermost last
        #: (cuvil/frontend/decompose.py); per compile, as two threads may trace at once
        self.decomposing: list[Any] = []
        #: the layout guards ``is_contiguous()`` answers needed, by argument leaf
        #: (cuvil/frontend/layout.py)
        self.layout_guards: dict[int, LayoutGuard] = {}
        #: inputs updated in place, in order: (proxy, its value before, where)
        #: (cuvil/frontend/input_writes.py)
        self.input_writes: list[tuple[TensorProxy, Value, SourceLoc | None]] = []

    # -- the capture in progress -------------------------------------------------
    @staticmethod
    def current() -> Tracer | None:
        """The tracer of the capture in progress in this thread (hooks in converted code
        consult it), or None."""
        return _CURRENT.get()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """This tracer is :meth:`current` inside the block, in this thread only: two
        threads may capture two functions at once."""
        token = _CURRENT.set(self)
        try:
            yield
        finally:
            _CURRENT.reset(token)

    # -- tentative recording ---------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """What :meth:`rollback` needs to forget everything recorded after this call."""
        hints = self.ctx.hints
        return Checkpoint(
            len(self.nodes),
            len(self.inputs),
            len(self.lifted),
            dict(self._consts),
            dict(self._lifted_ids),
            frozenset(self._names),
            frozenset(self.seen_data_sizes),
            frozenset(self.ctx.data_symbols),
            dict(hints) if hints is not None else None,
            dict(self.layout_guards),
            len(self.input_writes),
        )

    def recorded_since(self, cp: Checkpoint) -> Sequence[Node]:
        """The nodes recorded (in the current block) since checkpoint ``cp``."""
        return self.nodes[cp.nodes :]

    def rollback(self, cp: Checkpoint) -> None:
        """Forget what was recorded since ``cp`` (taken in the same block): nodes, inputs
        and lifted tensors, constants, input names, data-dependent size symbols, size
        hints and layout guards are as they were. See [Note: tracer checkpoints]."""
        # in place: a region being recorded holds these very objects (Tracer.region)
        del self.nodes[cp.nodes :]
        del self.inputs[cp.inputs :]
        del self.lifted[cp.lifted :]
        restore(self._consts, cp.consts)
        restore(self._lifted_ids, cp.lifted_ids)
        restore(self._names, cp.names)
        restore(self.seen_data_sizes, cp.seen_data_sizes)
        restore(self.ctx.data_symbols, cp.data_symbols)
        if self.ctx.hints is not None and cp.hints is not None:
            restore(self.ctx.hints, cp.hints)
        restore(self.layout_guards, cp.layout_guards)
        for proxy, before, _ in reversed(self.input_writes[cp.input_writes :]):
            proxy._cuvil_value = before
        del self.input_writes[cp.input_writes :]

    # -- values --------------------------------------------------------------
    def _fresh(self, t: Type) -> Value:
        self._counter += 1
        v = Value(f"v{self._counter}", t)
        self._home[v] = self._open[-1]
        return v

    @contextlib.contextmanager
    def region(self, arg_types: Sequence[Type] = ()) -> Iterator[Region]:
        """Record the nodes of one block; see [Note: region scoping]."""
        outer_nodes, outer_consts = self.nodes, self._consts
        self.nodes, self._consts = [], dict(outer_consts)
        self._regions += 1
        self._open.append(self._regions)
        region = Region(self, tuple(self._fresh(t) for t in arg_types))
        try:
            yield region
        finally:
            region.nodes = tuple(self.nodes)
            self._open.pop()
            self.nodes, self._consts = outer_nodes, outer_consts

    def visible(self, v: Value) -> bool:
        return self._home.get(v, 0) in self._open

    def add_input(
        self, name: str, example: torch.Tensor, symbolic: bool, dim_names: dict[int, str] | None = None
    ) -> TensorProxy:
        """A graph input; with ``symbolic`` each size is a symbol named ``<name>_<axis>``
        unless ``dim_names`` names it (inputs sharing a name share the symbol)."""
        if name in self._names:
            raise ValueError(f"duplicate graph input name {name}")
        self._names.add(name)
        assert self.ctx.hints is not None
        named = {(a % example.dim() if example.dim() else a): n for a, n in (dim_names or {}).items()}
        shape: list[Any] = []
        for axis, size in enumerate(example.shape):
            if symbolic:
                s = symbol(named.get(axis, f"{_sanitize(name)}_{axis}"))
                if self.ctx.hints.get(s, int(size)) != int(size):
                    raise CompileError(
                        f"dims: {name}.shape[{axis}] is {int(size)} but another input's size named "
                        f"{s} is {self.ctx.hints[s]}; sizes given one name must be equal"
                    )
                self.ctx.hints[s] = int(size)
                shape.append(s)
            else:
                shape.append(int(size))
        t = TensorType(DType.from_torch(example.dtype), tuple(shape), str(example.device))
        v = Value(name, t)
        self.inputs.append(v)
        p = TensorProxy(self, v)
        p._cuvil_is_input = True
        return p

    def add_size_input(self, name: str, value: int) -> Any:
        """An int argument leaf as a size symbol ([Note: int attributes are sizes] in
        cuvil/frontend/arg_objects.py): a hidden graph input of shape ``(n, 0)`` binds it;
        returns the symbol and the ``torch.SymInt`` the traced code gets."""
        if name in self._names:
            raise ValueError(f"duplicate graph input name {name}")
        self._names.add(name)
        assert self.ctx.hints is not None
        s = symbol(_sanitize(name))
        if self.ctx.hints.get(s, value) != value:
            raise CompileError(
                f"the size symbol {s} of argument {name} is {value} here and {self.ctx.hints[s]} elsewhere"
            )
        self.ctx.hints[s] = value
        self.inputs.append(Value(name, TensorType(DType.i64, (s, 0), "cpu")))
        return s, self.size(s)

    def lift(self, t: torch.Tensor) -> TensorProxy:
        """A real tensor met during tracing becomes a graph input (never a baked constant)."""
        proxy = self._lifted_ids.get(id(t))
        if proxy is not None:
            return proxy
        source = self._lift_sources.get(id(t)) or self._global_source(t)
        name, getter, place = source or (f"const{len(self.lifted)}", functools.partial(_identity, t), None)
        base, n = name, 1
        while name in self._names:  # two helpers' closure variables of the same name
            n += 1
            name = f"{base}_{n}"
        proxy = self.add_input(name, t, symbolic=False)
        self.lifted.append(Lifted(proxy._cuvil_value, name, getter, place))
        self._lifted_ids[id(t)] = proxy
        self._keepalive.append(t)
        return proxy

    def outer(self, value: Any) -> Any:
        """``value`` as the graph input it is when it is a real tensor the traced code read
        from outside the call (a global, closure variable or attribute: a lift source), so
        reading its value (``int(T)``, ``T.item()``, ``if T:``) is what it is for an argument
        tensor (a size bound when the code runs, a captured ``if``, or a located refusal),
        never the value at capture; anything else unchanged."""
        if (
            isinstance(value, torch.Tensor)
            and not isinstance(value, TensorProxy)
            and id(value) in self._lift_sources
        ):
            return self.lift(value)
        return value

    def _global_source(self, t: torch.Tensor) -> LiftSource | None:
        """A module-level variable of user code (any frame of the trace) holding ``t``."""
        f = sys._getframe(1)
        while f is not None:
            if is_user_frame(f):
                g = f.f_globals
                for name in f.f_code.co_names:
                    if g.get(name) is t:
                        return f"global.{name}", functools.partial(g.__getitem__, name), global_place(g, name)
            f = f.f_back  # type: ignore[assignment]
        return None

    def const(self, value: Any) -> Value:
        key = (type(value), value)
        v = self._consts.get(key)
        if v is None:
            v = self._fresh(ScalarType(ScalarKind.of(value)))
            self.nodes.append(Node("const", (), (v,), (("value", value),), loc=self.loc()))
            self._consts[key] = v
        return v

    def value_of(self, h: Any) -> Value:
        if isinstance(h, TensorProxy):
            if h._cuvil_tracer is not self:
                raise CompileError(
                    "a tensor from another compiled function leaked into this one", self.source_loc()
                )
            if not self.visible(h._cuvil_value):
                raise CompileError(
                    "a tensor computed inside a branch or loop body is used outside it",
                    self.source_loc(),
                    "return it from the branch (assign it in both branches) or carry it through the loop",
                )
            return h._cuvil_value
        if isinstance(h, torch.Tensor):
            return self.lift(h)._cuvil_value
        if isinstance(h, SYM):
            return self.const(self.sym(h))
        if isinstance(h, (bool, int, float)) or isinstance(h, sympy.Basic):
            return self.const(h)
        raise CompileError(f"cannot use a {type(h).__name__} as an operand", self.source_loc())

    def wrap(self, v: Value) -> Any:
        if isinstance(v.type, TensorType):
            return TensorProxy(self, v)
        raise CompileError(f"op produced a {v.type}, which cannot be used from Python yet", self.source_loc())

    # -- Emitter protocol (used by capture rules) ------------------------------
    def emit(self, op: str, inputs: Sequence[Any], **attrs: Any) -> Any:
        opdef = REGISTRY.get(op)
        vals = tuple(self.value_of(h) for h in inputs)
        norm = {k: attribute(v) for k, v in attrs.items()}
        known = len(self.ctx.assumptions)
        try:
            out_types = infer_types(opdef, self.ctx, [v.type for v in vals], norm)
        except (CompileError, NotCaptured):
            raise
        except DataSizeError as e:
            raise CompileError(f"{op}: {e}", self.source_loc(), data_sizes.HINT) from None
        except Exception as e:
            raise CompileError(f"{op}: {e}", self.source_loc()) from e
        if len(self.ctx.assumptions) > known:
            where = self.source_loc()
            for fact in self.ctx.assumptions[known:]:
                why = self.ctx.reasons.get(fact, "")
                self.ctx.reasons[fact] = f"{where}: {op}" + (f" ({why})" if why else "")
        outs = tuple(self._fresh(t) for t in out_types)
        self.nodes.append(Node(op, vals, outs, tuple(norm.items()), loc=self.loc()))
        handles = [self.wrap(v) for v in outs]
        if "view" in opdef.traits and inputs and isinstance(inputs[0], TensorProxy):
            base = inputs[0] if inputs[0]._cuvil_base is None else inputs[0]._cuvil_base
            base._cuvil_has_views = True
            for h in handles:
                h._cuvil_base = base
        if opdef.num_outputs == 1:
            return handles[0]
        return tuple(handles)

    def type_of(self, h: Any) -> Type:
        if isinstance(h, TensorProxy):
            return h._cuvil_value.type
        if isinstance(h, torch.Tensor):
            return self.lift(h)._cuvil_value.type
        if isinstance(h, (bool, int, float)) or isinstance(h, sympy.Basic):
            return ScalarType(ScalarKind.of(h))
        raise TypeError(f"no IR type for {type(h).__name__}")

    def is_value(self, h: Any) -> bool:
        return isinstance(h, torch.Tensor)

    def rebind(self, target: Any, result: Any) -> Any:
        if not isinstance(target, TensorProxy):
            raise CompileError("in-place update of something that is not a traced tensor", self.source_loc())
        if target._cuvil_base is not None or target._cuvil_has_views:
            raise CompileError(
                "in-place update of a tensor that shares memory with a view is not supported yet",
                self.source_loc(),
                "use the out-of-place op, or .clone() before updating in place",
            )
        if target.ir_type != result.ir_type:
            raise CompileError(
                f"in-place update changes the type {target.ir_type} to {result.ir_type}", self.source_loc()
            )
        if self._home.get(target._cuvil_value, 0) != self._open[-1]:
            raise CompileError(
                "in-place update, inside a branch or loop body, of a tensor defined outside it",
                self.source_loc(),
                "assign a new value instead (`x = x + 1`): assignments are carried out of branches and loops",
            )
        if target._cuvil_is_input:
            # an argument tensor updated in place: its final value is written back into the
            # caller's tensor after each run (cuvil/frontend/input_writes.py)
            self.input_writes.append((target, target._cuvil_value, self.source_loc()))
        target._cuvil_value = result._cuvil_value
        return target

    # -- torch symbolic sizes ----------------------------------------------------
    def sym(self, value: Any) -> Any:
        """Our size expression for a ``torch.SymInt`` (etc.) held by user code."""
        try:
            return self.mirror.ours(value, "size")
        except FakeInferenceError as e:
            raise CompileError(str(e), self.source_loc()) from None

    def example_dim(self, d: Any) -> int:
        """A proxy's concrete size (torch wants one; ``metadata`` answers from the IR type)."""
        return data_sizes.example_dim(self, d)

    def size(self, d: Any) -> Any:
        """The ``torch.SymInt`` user code sees for a size expression."""
        return self.mirror.symint(d)

    def sync(self, reason: str | None = None) -> None:
        """Facts torch decided while user code computed with sizes become assumptions."""
        if self.mirror._synced < len(self.mirror.env.guards):
            loc = self.source_loc()
            try:
                self.mirror.sync(
                    reason or (f"{loc}: Python code used a size" if loc else "Python code used a size")
                )
            except UndecidableError as e:
                raise CompileError(
                    str(e), loc, "the loop index can be used in tensor ops and sizes, not as a Python value"
                ) from None
        data_sizes.assert_sizes(self, "Python code used a size computed from tensor data")

    # -- locations ------------------------------------------------------------
    def source_loc(self) -> SourceLoc | None:
        """Where in user code the call being traced is (cuvil/frontend/locations.py)."""
        return locations.source_loc(self._positions)

    def loc(self) -> Loc | None:
        s = self.source_loc()
        return Loc(s.file, s.line, s.col + 1) if s else None

    # -- the torch-function handler -----------------------------------------
    def mode(self) -> TorchFunctionMode:
        return _Mode(self)

    def handle(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.sync()
        amp = autocast.active(self)
        if amp:  # the casts autocast makes, recorded ([Note: autocast captured])
            args, kwargs = autocast.cast_operands(self, func, args, kwargs, amp)
        args, kwargs = torch_calls.weak_numbers(args, kwargs)
        answered = decompose.layout(self, func, args, kwargs)
        if answered is not NotImplemented:
            return answered
        answered = metadata.answer(self, func, args, kwargs)
        if answered is not metadata.UNHANDLED:
            return answered
        name = getattr(func, "__name__", "")
        if name in torch_calls.VALUE_READS and args:
            args = (self.outer(args[0]), *args[1:])
        has_proxy = torch_calls.any_leaf(args, kwargs, lambda x: isinstance(x, TensorProxy))
        has_sym = torch_calls.any_leaf(args, kwargs, lambda x: isinstance(x, SYM))
        if name == "item" and has_proxy and len(args) == 1:
            return data_sizes.data_size(self, args[0], "item")
        if name in torch_calls.DATA_DEPENDENT and has_proxy:
            raise CompileError(
                f"`{name}` needs the value of a tensor, which is only known when the compiled code runs",
                self.source_loc(),
                "data-dependent Python values are not supported yet; keep the computation in tensors",
            )
        inplace = False
        entry = REGISTRY.for_torch(func)
        if entry is None:
            entry = torch_calls.inplace_twin(func)
            inplace = entry is not None
            if inplace and not has_proxy:
                raise CompileError(
                    f"compiled code updates a tensor that is not an argument in place (`{name}`)",
                    self.source_loc(),
                    "pass the tensor as an argument, or return the new value instead of mutating",
                )
        nargs, nkwargs = torch_calls.normalize((args, kwargs), self.sym, self.lift)
        if entry is not None:
            result = self._apply(entry[1], nargs, nkwargs)
            if result is not NotImplemented:
                return self.rebind(nargs[0], result) if inplace else result
        runs_now = name.startswith("sym_") or (not has_sym and name not in torch_calls.NONDETERMINISTIC)
        if not has_proxy and runs_now:
            # size arithmetic (torch.sym_float ...) runs on the SymInts themselves; other
            # calls without traced values are constants, evaluated once and lifted if used
            return func(*args, **kwargs)
        if has_proxy and entry is None and not amp:  # (under autocast: the extern casts as eager)
            result = decompose.decompose(self, func, args, kwargs)
            if result is not NotImplemented:
                return result
        return self.extern(func, nargs, nkwargs)

    def _apply(self, rule: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return rule(self, *args, **kwargs)
        except NotCaptured:
            return NotImplemented
        except ShapeError as e:
            # shapes this op cannot take for the sizes the graph allows (often in a branch
            # whose condition rules out the example's sizes): the user's error, located
            raise CompileError(
                str(e),
                self.source_loc(),
                getattr(e, "hint", None)
                or "torch would raise here for these sizes; if this is a branch that cannot run, "
                "make the shapes agree there too",
            ) from None
        except TypeError as e:
            # a call form the rule does not accept: the extern path is always correct
            if "argument" in str(e):
                return NotImplemented
            raise CompileError(f"{getattr(rule, '__qualname__', rule)}: {e}", self.source_loc()) from e

    def extern(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            target = qualname(func)
        except ValueError as e:
            raise CompileError(str(e), self.source_loc()) from None
        if "out" in kwargs and kwargs["out"] is not None:
            raise CompileError(
                f"{target}(out=...) is not supported", self.source_loc(), "assign the result instead"
            )
        # an operator's name is before its overload: torch.ops.aten.add_.Tensor is `add_`
        name = target.split(".")[3] if target.startswith("torch.ops.") else target.rsplit(".", 1)[-1]
        mutates = (
            0
            if (
                name == "__setitem__"
                or (name.endswith("_") and not name.startswith("_"))
                or (name.startswith("__i") and name.endswith("__"))
            )
            else None
        )
        inputs: list[Value] = []
        value_of = self.value_of
        try:
            if name in INDEXING and len(args) >= 2:
                args = (args[0], mask_lists(args[0], args[1], self.ctx, self.source_loc), *args[2:])
                # the index key keeps lists as lists: `x[[1, 2]]` is advanced indexing
                # (a LongTensor index), `x[(1, 2)]` is `x[1, 2]`; see [Note: list indices]
                args_attr: AttrValue = (
                    argument_tree(args[0], inputs, value_of),
                    argument_tree(args[1], inputs, value_of, keep_lists=True),
                    *argument_tree(args[2:], inputs, value_of),  # type: ignore[misc]
                )
            else:
                args_attr = argument_tree(args, inputs, value_of)
            kwargs_attr = argument_tree(kwargs, inputs, value_of)
        except UnrecordableArgument as e:
            raise CompileError(
                f"cannot record an argument of an extern torch call: {e}", self.source_loc()
            ) from None
        in_types = [v.type for v in inputs]
        try:
            out_types, out_spec = fake_call(
                self.ctx, func, in_types, args_attr, kwargs_attr, target, mutates, self.mirror
            )
        except FakeInferenceError as e:
            raise CompileError(str(e), self.source_loc()) from None
        if mutates is not None and isinstance(args[0], TensorProxy):
            # the result of an in-place call is its target, of the target's type: a size
            # torch specialized meanwhile is an assumption already (sync), not a new type
            mine = args[0].ir_type
            if isinstance(mine, TensorType) and out_types[0].replace(shape=mine.shape) == mine:
                out_types = [mine, *out_types[1:]]
        data_sizes.check_bindable(self, target, out_types)
        outs = tuple(self._fresh(t) for t in out_types)
        attrs: tuple[tuple[str, AttrValue], ...] = (
            ("args", args_attr),
            ("kwargs", kwargs_attr),
            ("mutates", mutates),
            ("target", target),
        )
        amp = autocast.active(self)
        if amp:  # it runs under autocast, as in eager (its types came from the same)
            attrs += (("autocast", tuple((d, DType.from_torch(t)) for d, t in amp)),)
        self.nodes.append(Node("extern", tuple(inputs), outs, attrs, loc=self.loc()))
        data_sizes.assert_sizes(self, f"{target} on sizes computed from tensor data")
        handles = [self.wrap(v) for v in outs]
        if mutates is not None:
            return self.rebind(args[0], handles[0])
        return pytree.tree_unflatten(handles, out_spec)

    # -- result ---------------------------------------------------------------
    def graph(self, outputs: Sequence[Value]) -> Graph:
        self.sync()
        binds = data_sizes.binding_nodes(self.nodes, self.inputs)
        nodes = eliminate_dead_code(tuple(self.nodes), set(outputs), binds)
        return Graph(self.name, tuple(self.inputs), nodes, tuple(outputs), tuple(self.ctx.assumptions))


class Region:
    """A block being recorded: its arguments (as handles) and, on finishing, its results."""

    def __init__(self, tracer: Tracer, args: tuple[Value, ...]) -> None:
        self.tracer = tracer
        self.arg_values = args
        self.args = [tracer.wrap(v) for v in args]
        self.nodes: tuple[Node, ...] = ()
        self.results: tuple[Value, ...] = ()

    def finish(self, handles: Sequence[Any]) -> None:
        """Set the block's results (call while the region is still open)."""
        self.results = tuple(self.tracer.value_of(h) for h in handles)

    @property
    def block(self) -> Block:
        return Block(self.arg_values, self.nodes, self.results)


def _identity(x: Any) -> Any:
    return x


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else "s" + out


__all__ = ["Lifted", "Tracer"]
