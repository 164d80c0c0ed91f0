"""Graph IR -> Tensor IR: tensors as index functions, realized into kernels only when needed.

See docs/tensor-and-loop-ir.md. The per-op rules live in
:mod:`cuvil_ir.tensor_ir.rules` (they see the lowering as a
:class:`~cuvil_ir.tensor_ir.lowering_context.LoweringContext`), the backend's choices in
:mod:`cuvil_ir.tensor_ir.fusion_policy`, what the graph's size facts give in
:mod:`cuvil_ir.tensor_ir.size_facts`; this module holds the mechanism: lazy tensors,
the realization policy, the split of reductions the scheduler could not hoist
without recomputing them, extern calls, control flow and outputs, and :func:`lower`,
the driver (Graph IR passes, the lowering, Tensor IR passes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, Block, Graph, Node, Ref, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import DType, ScalarType, TensorType
from cuvil_ir.graph_ir.verifier import verify as verify_graph
from cuvil_ir.passes import Pass, Pipeline
from cuvil_ir.symbolic import Dim, symbol
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
from cuvil_ir.tensor_ir.lowering_context import LoweringContext
from cuvil_ir.tensor_ir.memory import plan_program
from cuvil_ir.tensor_ir.program import (
    CHANNELS_LAST,
    Buffer,
    Control,
    Extern,
    Kernel,
    Operand,
    ProgramInput,
    ScalarRef,
    Step,
    TensorProgram,
    View,
    layout_strides,
)
from cuvil_ir.tensor_ir.rules import RULES
from cuvil_ir.tensor_ir.size_facts import facts_under, specialize
from cuvil_ir.tensor_ir.values import (
    SCALAR_DTYPES,
    Lazy,
    NotLowered,
    Val,
    idx,
    strided_offset,
    strided_view,
)
from cuvil_ir.tensor_ir.values import as_dim as _dim
from cuvil_ir.tensor_ir.verify import verify as verify_program


class Lowering:
    """Lowers one graph (or region) to a :class:`TensorProgram`."""

    def __init__(self, policy: FusionPolicy, prefix: str = "") -> None:
        self.policy = policy
        self.prefix = prefix
        self.buffers: dict[str, Buffer] = {}
        self.steps: list[Step] = []
        self.env: dict[str, Val] = {}
        self.uses: Counter[str] = Counter()
        #: values some node writes in place (an extern's ``mutates`` operand)
        self.written: set[str] = set()
        self.seeds: list[str] = []
        self._count: Counter[str] = Counter()
        self._reduce_count = 0
        self.rules = _rules()
        #: the graph's size assumptions: rules decide sign and clamp facts under them
        #: (a slice start of ``-3`` on a dim of size ``x_0 < 3`` clamps to 0)
        self.assumptions: tuple[sympy.Basic, ...] = ()
        #: the device of the tensors met so far (for the copies of :meth:`_extern_copy`)
        self.device = "cpu"
        #: scalar values that are size predicates (the conditions of size branches)
        self.size_predicates: dict[str, sympy.Basic] = {}

    # -- names -------------------------------------------------------------------
    def fresh(self, kind: str) -> str:
        n = self._count[kind]
        self._count[kind] += 1
        return f"{self.prefix}{kind}{n}"

    def seed(self) -> E.Arg:
        """A fresh random seed, drawn by the runtime once per call (see ``TensorProgram.seeds``)."""
        arg = E.Arg(self.fresh("seed"), DType.i64)
        self.seeds.append(arg.name)
        return arg

    def reduce_symbol(self) -> sympy.Symbol:
        # temporary: make_reduce renames it canonically
        s = sympy.Symbol(f"_rt{self._reduce_count}", integer=True, nonnegative=True)
        self._reduce_count += 1
        return s

    # -- buffers and kernels -------------------------------------------------------
    def add_buffer(
        self,
        dtype: DType,
        shape: tuple[Dim, ...],
        kind: str,
        name: str | None = None,
        order: tuple[int, ...] | None = None,
        given: tuple[Dim, ...] | None = None,
    ) -> str:
        name = name or self.fresh("b")
        self.buffers[name] = Buffer(name, dtype, tuple(_dim(d) for d in shape), kind, order, given)
        return name

    def load(self, buf: str) -> Lazy:
        b = self.buffers[buf]
        return Lazy(b.shape, b.dtype, E.Load(buf, strided_offset(b.strides, idx(len(b.shape))), b.dtype))

    def is_whole(self, lz: Lazy) -> str | None:
        """The buffer ``lz`` is exactly (same shape, in its own layout, offset 0), if any."""
        if isinstance(lz.body, E.Load):
            b = self.buffers[lz.body.buf]
            if tuple(b.shape) == tuple(lz.shape) and b.dtype == lz.dtype:
                if sympy.expand(lz.body.offset - strided_offset(b.strides, idx(lz.rank))) == 0:
                    return b.name
        return None

    def layout_for(self, lz: Lazy) -> tuple[int, ...] | None:
        """A temporary takes the layout of the buffers it is computed from (a value
        between two channels-last convolutions stays channels-last), else row-major."""
        for x in E.walk(lz.body):
            if isinstance(x, E.Load):
                b = self.buffers[x.buf]
                if b.order is not None and len(b.shape) == lz.rank and tuple(b.shape) == tuple(lz.shape):
                    return b.order
        return None

    def realize(self, lz: Lazy, kind: str = "temp", order: tuple[int, ...] | None | str = "auto") -> Lazy:
        """Write ``lz`` into a new buffer with one kernel (unless it already is a buffer).

        ``order``: the new buffer's layout (``"auto"``: see :meth:`layout_for`; outputs
        are always row-major, as eager returns them). An input read by its call's
        strides (``Buffer.given``) is copied: callers rely on the result's layout.
        """
        whole = self.is_whole(lz) if kind == "temp" else None
        if (
            whole is not None
            and self.buffers[whole].given is None
            and (order == "auto" or self._has_order(lz, order))
        ):
            return lz
        if lz.dtype not in self.policy.dtypes:
            return self._extern_copy(lz)
        if kind != "temp":
            order = None
        elif order == "auto":
            order = self.layout_for(lz)
        body = self._split_low_rank(self._split_reductions(lz.body, lz.shape), lz.shape)
        buf = self.add_buffer(lz.dtype, lz.shape, kind, order=order)  # type: ignore[arg-type]
        self.steps.append(Kernel(self.fresh("k"), buf, tuple(lz.shape), body))
        return self.load(buf)

    def _extern_copy(self, lz: Lazy) -> Lazy:
        """A copy no kernel can make (kernels do not hold ``lz.dtype``: bf16, f16 ...):
        an extern call. Such a value is always a view of a buffer (every op on the dtype
        is an extern), e.g. an input or an extern's result returned twice."""
        sv = strided_view(lz)
        if sv is None:
            raise NotLowered(f"a {lz.dtype} value that is not a view of a buffer")
        # a channels-last buffer is copied to row-major, as eager returns it
        target = "torch.Tensor.contiguous" if self.buffers[sv[0]].order is not None else "torch.clone"
        t = TensorType(lz.dtype, tuple(lz.shape), self.device)
        node = Node(
            "extern",
            (Value(self.fresh("copy_in"), t),),
            (Value(self.fresh("copy"), t),),
            (("args", (Ref(0),)), ("kwargs", KV(())), ("mutates", None), ("target", target)),
        )
        operand = View(sv[0], tuple(lz.shape), sv[1], sv[2])
        outs = self.bind_results(node, "extern")
        self.steps.append(Extern(self.fresh("e"), node, (operand,), outs, False))
        return self.load(outs[0])

    def _split_low_rank(self, body: E.Expr, domain: tuple[Dim, ...]) -> E.Expr:
        """Realize costly subexpressions that vary with fewer indices than the kernel.

        Inference batch norm computes ``rsqrt(var[c] + eps)`` for every pixel though
        it depends on the channel only; as a buffer of ``C`` values it is computed
        once per channel and loaded per pixel. Only calls costing at least
        ``policy.low_rank_cost`` (a transcendental) and free of reductions move, so
        cheap index arithmetic never becomes a kernel of its own.
        """
        if not domain:
            return body
        live = {E.index_symbol(j) for j, d in enumerate(domain) if d != 1}
        found: list[E.Expr] = []

        def visit(x: E.Expr) -> None:
            if isinstance(x, E.Call) and E.cost(x) >= self.policy.low_rank_cost:
                free = E.free_indices(x)
                if free < live and not any(isinstance(y, E.Reduce) for y in E.walk(x)):
                    if all(s.name.startswith("_i") for s in free):
                        found.append(x)
                        return
            for c in E.children(x):
                visit(c)

        visit(body)
        for sub in dict.fromkeys(found):
            syms = sorted(E.free_indices(sub), key=lambda s: int(s.name[2:]))
            shape = tuple(domain[int(s.name[2:])] for s in syms)
            inner = E.substitute(sub, {s: E.index_symbol(j) for j, s in enumerate(syms)})
            done = self.realize(Lazy(shape, sub.dtype, inner), order=None)
            body = E.replace(body, sub, done.at(syms))
        return body

    def _split_reductions(self, body: E.Expr, domain: tuple[Dim, ...]) -> E.Expr:
        """Realize every Reduce the backend's policy says its scheduler cannot keep in
        the kernel (``FusionPolicy.realize_reduction``) as a buffer of its own."""
        realize = self.policy.realize_reduction
        if realize is None:
            return body
        while True:
            reds = list(dict.fromkeys(r for r in E.walk(body) if isinstance(r, E.Reduce)))
            if not reds:
                return body
            ranges = {s: n for r in reds for s, n in r.ranges}
            free = {r: E.free_indices(r) for r in reds}
            positions = [int(s.name[2:]) for r in reds for s in free[r] if s.name.startswith("_i")]
            k = max(positions, default=-1) + 1
            needed = {E.index_symbol(j) for j in range(k) if domain[j] != 1}
            bad = [r for r in reds if realize(r, frozenset(free[r]), frozenset(needed))]
            if not bad:
                return body
            # an offender with no other offender inside it first, so the outer one reads its buffer
            inner_bad = [b for b in bad if not any(o is not b and o in set(E.walk(b.body)) for o in bad)]
            r = inner_bad[0] if inner_bad else bad[-1]
            syms = sorted(free[r], key=lambda s: (s.name[1], int(s.name[2:])))
            shape = tuple(domain[int(s.name[2:])] if s.name.startswith("_i") else ranges[s] for s in syms)
            inner = E.substitute(r, {s: E.index_symbol(j) for j, s in enumerate(syms)})
            done = self.realize(Lazy(shape, r.dtype, inner))
            repl = done.at(syms)
            body = E.replace(body, r, repl)

    # -- graph walking -------------------------------------------------------------
    def lower_graph(self, graph: Graph, name: str, strided_inputs: bool = False) -> TensorProgram:
        inputs = []
        for v in graph.inputs:
            inputs.append(self.bind_input(v, strided_inputs))
        return self.lower_block(graph, name, graph.nodes, graph.outputs, tuple(inputs))

    def bind_input(self, v: Value, strided: bool = False) -> ProgramInput:
        """A graph input; ``strided``: a tensor is read with the strides the call's
        tensor has (size symbols ``stride_<buffer>_<dim>``, bound per call), not as a
        row-major array."""
        if isinstance(v.type, TensorType):
            name = self.fresh("in")
            given = None
            if strided:
                # a dim of size 1 is only ever read at index 0: its stride does not matter
                shape = v.type.shape
                given = tuple(0 if d == 1 else symbol(f"stride_{name}_{k}") for k, d in enumerate(shape))
            buf = self.add_buffer(v.type.dtype, v.type.shape, "input", name=name, given=given)
            self.device = v.type.device
            self.env[v.name] = self.load(buf)
            return ProgramInput(buf, True)
        assert isinstance(v.type, ScalarType)
        name = self.fresh("arg")
        self.env[v.name] = E.Arg(name, SCALAR_DTYPES[v.type.kind])
        return ProgramInput(name, False)

    def lower_block(
        self,
        graph: Graph,
        name: str,
        nodes: Sequence[Node],
        results: Sequence[Value],
        inputs: tuple[ProgramInput, ...],
        outer_symbols: tuple[sympy.Symbol, ...] = (),
    ) -> TensorProgram:
        for n in nodes:
            for v in n.inputs:
                self.uses[v.name] += 1
            mutated = n.attr("mutates")
            if isinstance(mutated, int) and 0 <= mutated < len(n.inputs):
                self.written.add(n.inputs[mutated].name)
            for v in _region_free_values(n):
                self.uses[v.name] += 1
        for v in results:
            self.uses[v.name] += 1
        for n in nodes:
            self.lower_node(n)
        outputs: list[str | E.Expr] = []
        seen: set[str] = set()
        for v in results:
            val = self.env[v.name]
            if isinstance(val, Lazy):
                buf = self.is_whole(val)
                if buf is not None and self.buffers[buf].order is not None:
                    buf = None  # eager returns row-major tensors: copy out of a channels-last one
                if buf is not None and buf not in seen and self.buffers[buf].kind in ("temp", "output"):
                    b = self.buffers[buf]
                    self.buffers[buf] = Buffer(b.name, b.dtype, b.shape, "output")
                elif buf is None or buf in seen or self.buffers[buf].kind != "extern":
                    buf = self.is_whole(self.realize(val, kind="output"))
                assert buf is not None
                seen.add(buf)
                outputs.append(buf)
            else:
                outputs.append(val)
        return TensorProgram(
            name,
            graph,
            inputs,
            dict(self.buffers),
            tuple(self.steps),
            tuple(outputs),
            outer_symbols,
            seeds=tuple(self.seeds),
            device=self.device,
        )

    def lower_node(self, n: Node) -> None:
        if n.op == "const" and isinstance(n.attr("value"), sympy.Basic):
            self.size_predicates[n.outputs[0].name] = n.attr("value")
        for v in n.outputs:
            if isinstance(v.type, TensorType):
                self.device = v.type.device
        ins = [self.env[v.name] for v in n.inputs]
        out_vals: list[Val] | None = None
        if n.op in ("if", "for", "while"):
            self.lower_control(n, ins)
            return
        rule = self.rules.get(n.op)
        if self.policy.native is not None and isinstance(n.attr(f"lower_{self.policy.native}"), str):
            rule = self.rules.native  # the op's own lowering for this target replaces its decomposition
        if rule is not None and n.op not in self.policy.extern_ops and self._dtypes_ok(n):
            context: LoweringContext = self  # what a rule may use of the lowering
            try:
                res = rule(context, n, *ins)
                out_vals = list(res) if isinstance(res, (list, tuple)) else [res]
            except NotLowered:
                out_vals = None
        if out_vals is None:
            self.lower_extern(n, ins)
            return
        for v, val in zip(n.outputs, out_vals):
            if isinstance(val, Lazy):
                val = self._maybe_realize(v, val)
            self.env[v.name] = val

    def _dtypes_ok(self, n: Node) -> bool:
        for v in (*n.inputs, *n.outputs):
            if isinstance(v.type, TensorType) and v.type.dtype not in self.policy.dtypes:
                return False
        return True

    def _maybe_realize(self, v: Value, lz: Lazy) -> Lazy:
        if isinstance(lz.body, E.Load):
            return lz
        if E.size(lz.body) > self.policy.max_expr_nodes:
            return self.realize(lz)
        if self.uses[v.name] > 1 and E.cost(lz.body) > self.policy.recompute_budget:
            return self.realize(lz)
        return lz

    # -- operands of externs and control flow ---------------------------------------
    def _has_order(self, lz: Lazy, order: Any) -> bool:
        sv = strided_view(lz)
        if sv is None:
            return False
        want = layout_strides(tuple(lz.shape), order)
        return all(
            d == 1 or sympy.expand(sympy.sympify(a) - b) == 0 for d, a, b in zip(lz.shape, sv[1], want)
        )

    def operand(self, val: Val, order: tuple[int, ...] | None = None) -> Operand:
        """``val`` as an extern operand: a strided view of a buffer (realized if it is
        not one; in layout ``order`` when the op wants one)."""
        if not isinstance(val, Lazy):
            return ScalarRef(val)
        if order is not None and not self._has_order(val, order):
            val = self.realize(val, order=order)
        sv = strided_view(val)
        if sv is None or not all(sympy.sympify(s).is_nonnegative for s in (*sv[1], sv[2])):
            val = self.realize(val)
            sv = strided_view(val)
            assert sv is not None
        buf, strides, offset = sv
        return View(buf, tuple(val.shape), strides, offset)

    def lower_extern(self, n: Node, ins: list[Val]) -> None:
        cl = n.op in self.policy.channels_last_ops
        for k, (v, val) in enumerate(zip(n.inputs, ins)):
            # A computed value that this extern needs in a buffer and others read too: realized
            # once, here, and read from that buffer by the rest (each extern realized it anew:
            # a decoder layer computed its cache positions twice, once per cache write). Not a
            # value any extern writes in place (each of its readers keeps a buffer of its own,
            # as before), nor one this extern wants in another layout.
            if (
                isinstance(val, Lazy)
                and v.name not in self.written
                and not (cl and k == 0 and val.rank == 4)
                and self.uses[v.name] > 1
                and self.env.get(v.name) is val
                and strided_view(val) is None
            ):
                ins[k] = self.env[v.name] = self.realize(val)
        operands = tuple(
            self.operand(v, CHANNELS_LAST if cl and k == 0 and isinstance(v, Lazy) and v.rank == 4 else None)
            for k, v in enumerate(ins)
        )
        into = n.op in self.policy.out_variants and all(isinstance(v.type, TensorType) for v in n.outputs)
        outs = self.bind_results(n, "temp" if into else "extern", CHANNELS_LAST if cl else None)
        self.steps.append(Extern(self.fresh("e"), n, operands, outs, into))

    def bind_results(self, n: Node, kind: str, order: tuple[int, ...] | None = None) -> tuple[str, ...]:
        """A buffer (tensor results; 4-d ones in layout ``order``) or a runtime scalar
        argument (scalar results) per output of an extern or control-flow node."""
        outs = []
        for v in n.outputs:
            if isinstance(v.type, TensorType):
                layout = order if v.type.rank == 4 else None
                buf = self.add_buffer(v.type.dtype, v.type.shape, kind, order=layout)
                outs.append(buf)
                self.env[v.name] = self.load(buf)
            else:
                assert isinstance(v.type, ScalarType)
                name = self.fresh("s")
                outs.append(name)
                self.env[v.name] = E.Arg(name, SCALAR_DTYPES[v.type.kind])
        return tuple(outs)

    def lower_control(self, n: Node, ins: list[Val]) -> None:
        free = _region_free_values(n)
        operands = tuple(self.operand(v) for v in ins) + tuple(self.operand(self.env[v.name]) for v in free)
        name = self.fresh("c")
        regions = []
        loop_var: tuple[sympy.Symbol, ...] = ()
        if n.op == "for":
            loop_var = (symbol(str(n.attr("var"))),)
        cond = self.size_predicates.get(n.inputs[0].name) if n.op == "if" and n.inputs else None
        for r, block in enumerate(n.regions):
            sub = Lowering(self.policy, prefix=f"{name}r{r}_")
            sub.device, sub.size_predicates = self.device, self.size_predicates
            sub.assumptions = self.assumptions
            region = Graph(f"{name}r{r}", (*block.args, *free), block.nodes, block.results)
            if cond is not None:
                # see [Note: facts of a size branch]
                sub.assumptions = facts_under(self.assumptions, cond if r == 0 else sympy.Not(cond))
                region = specialize(
                    Graph(region.name, region.inputs, region.nodes, region.outputs, sub.assumptions)
                )
            inputs = tuple(sub.bind_input(v) for v in region.inputs)
            regions.append(
                plan_program(
                    sub.lower_block(region, region.name, region.nodes, region.outputs, inputs, loop_var)
                )
            )
        self.steps.append(Control(name, n, operands, tuple(regions), self.bind_results(n, "extern")))


def _region_free_values(n: Node) -> list[Value]:
    """Values a node's regions use but do not define (values of enclosing blocks)."""
    if not n.regions:
        return []
    defined: set[str] = set()
    used: dict[str, Value] = {}

    def visit(block: Block) -> None:
        for a in block.args:
            defined.add(a.name)
        for m in block.nodes:
            for v in m.inputs:
                used.setdefault(v.name, v)
            for r in m.regions:
                visit(r)
            for v in m.outputs:
                defined.add(v.name)
        for v in block.results:
            used.setdefault(v.name, v)

    for r in n.regions:
        visit(r)
    return [v for k, v in sorted(used.items()) if k not in defined]


def _specialize_pass() -> Pass[Graph]:
    return Pass(
        "specialize", specialize, "sizes the assumptions pin down substituted in types and attributes"
    )


#: the Graph IR passes lowering starts with, and the Tensor IR passes after it
GRAPH_PASSES: Pipeline[Graph] = Pipeline("graph_ir", [_specialize_pass()], verify_graph)
TENSOR_PASSES: Pipeline[TensorProgram] = Pipeline(
    "tensor_ir",
    [Pass("plan_memory", plan_program, "arena slots for temporaries, buffers reused after their last read")],
    verify_program,
)


def lower(graph: Graph, policy: FusionPolicy | None = None, *, strided_inputs: bool = False) -> TensorProgram:
    """Lower a verified Graph IR graph to Tensor IR (:data:`GRAPH_PASSES`, the lowering,
    then :data:`TENSOR_PASSES`: its memory plan).

    ``strided_inputs``: kernels read the tensor inputs by strides bound per call
    (:meth:`Lowering.bind_input`) instead of as row-major arrays."""
    lowering = Lowering(policy or FusionPolicy())
    lowering.assumptions = tuple(graph.assumptions)
    program = lowering.lower_graph(GRAPH_PASSES(graph), graph.name, strided_inputs)
    return TENSOR_PASSES(TENSOR_PASSES.produced("lower", program))


def _rules() -> Any:
    return RULES


__all__ = ["FusionPolicy", "Lazy", "Lowering", "NotLowered", "lower", "REGISTRY"]
