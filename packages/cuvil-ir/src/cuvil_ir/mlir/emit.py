"""Graph IR -> upstream MLIR (func, arith, math, tensor, linalg, scf).

The module is written as MLIR assembly text, then parsed and verified by the real
bindings (:mod:`cuvil_ir.mlir.bindings`); the text returned is the one MLIR prints.
Ops without an upstream equivalent become ``func.call`` s of declared external
functions ``@cuvil_extern_<op>_<n>`` and are listed in :attr:`MlirResult.externs`.
See ``docs/cuvil-ir-and-mlir.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from cuvil_ir.graph_ir.decompose import Decomposition, NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.fallbacks import fallback
from cuvil_ir.graph_ir.nodes import Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.mlir.elementwise import ARITH, TYPED, elementwise_primitives
from cuvil_ir.mlir.linalg import LinalgEmitter
from cuvil_ir.mlir.module import H, MlirError, Unsupported, attr_text, dtype_of, mlir_type, node_attr, quote
from cuvil_ir.mlir.reductions import _REDUCTIONS
from cuvil_ir.symbolic import symbol


@dataclass
class MlirResult:
    text: str
    externs: list[str]
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def lowerable(self) -> bool:
        return not self.externs


class _Emitter(LinalgEmitter):
    """Emits nodes (one ``op_<name>`` method per op family), regions and the function."""

    # -- nodes ----------------------------------------------------------------------------
    def extern(self, node: Node, reason: str) -> None:
        label = node.op if node.op != "extern" else f"extern:{node_attr(node, 'target')}"
        self.externs.setdefault(label, reason)
        ins = [(self.values[v.name][0], v.type) for v in node.inputs]
        in_types = ", ".join(mlir_type(t) for _, t in ins)
        out_types = ", ".join(mlir_type(o.type) for o in node.outputs)
        attrs = ", ".join(f"{k} = {attr_text(v)}" for k, v in node.attrs)
        key = (node.op, f"({in_types}) -> ({out_types})", attrs)
        name = self.extern_decls.get(key)
        if name is None:
            base = re.sub(r"[^A-Za-z0-9_]", "_", node.op)
            i = self.extern_count.get(base, 0)
            self.extern_count[base] = i + 1
            name = f"cuvil_extern_{base}_{i}"
            self.extern_decls[key] = name
        outs = [self.fresh() for _ in node.outputs]
        lhs = f"{', '.join(outs)} = " if outs else ""
        self.emit(f"{lhs}func.call @{name}({', '.join(v for v, _ in ins)}) : ({in_types}) -> ({out_types})")
        for o, s in zip(node.outputs, outs):
            self.values[o.name] = (s, o.type)

    def emitter_for(self, op: str) -> Callable[[Node], Any] | None:
        """The method emitting ``op``: its own ``op_<name>``, the elementwise or reduction
        family, or (for a composite op without one, or a primitive with a fallback
        decomposition: sdpa) :meth:`op_decomposed`."""
        fn: Callable[[Node], Any] | None = getattr(self, "op_" + op, None)
        if fn is None and op in _ELEMENTWISE:
            fn = self.op_elementwise
        if fn is None and op in _REDUCTIONS:
            fn = self.op_reduction
        if fn is None and (uses_decomposition(op, "mlir", native=False) or mlir_fallback(op) is not None):
            fn = self.op_decomposed
        return fn

    def run_nodes(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            self.node = node
            fn = self.emitter_for(node.op)
            if fn is None:
                reason = REGISTRY.get(node.op).extern_reasons.get("mlir") if node.op in REGISTRY else None
                self.extern(node, reason or "no upstream MLIR equivalent is emitted for this op")
                continue
            lines, depth, indent, scope = (
                len(self.lines),
                len(self.scopes),
                self.indent,
                dict(self.scopes[-1]),
            )
            try:
                res = fn(node)
            except Unsupported as e:
                del self.lines[lines:]
                # the constants the failed attempt emitted (and cached) are gone too
                del self.scopes[depth:]
                self.scopes[-1], self.indent, self.node = scope, indent, node
                self.extern(node, str(e))
                continue
            self.bind(node, res)

    def bind(self, node: Node, res: H | list[H]) -> None:
        for o, (v, t) in zip(node.outputs, res if isinstance(res, list) else [res]):
            self.values[o.name] = (self.cast_to(v, t, o.type), o.type)

    def op_decomposed(self, node: Node) -> list[H]:
        """A composite op emitted as its decomposition's primitives (one ``linalg``
        op each; the oracle needs no fusion), a primitive MLIR lacks as its fallback
        decomposition's. A primitive without an emitter makes the whole node one
        external call."""
        try:
            ex = expand(node, self.graph.assumptions, mlir_fallback(node.op))
        except NotDecomposed as e:
            raise Unsupported(str(e)) from None
        for m in ex.nodes:
            fn = self.emitter_for(m.op)
            if fn is None:
                raise Unsupported(f"its primitive {m.op} is not emitted")
            self.node = m
            self.bind(m, fn(m))
        self.node = node
        return [self.values[v.name] for v in ex.outputs]

    def op_const(self, node: Node) -> H:
        out = node.output.type
        value = node_attr(node, "value")
        if isinstance(out, TensorType):
            raise Unsupported("tensor constants are not emitted")
        d = SCALAR_DTYPES[out.kind]
        if isinstance(value, sympy.Basic) and not value.is_Number and value not in (sympy.true, sympy.false):
            if out.kind == ScalarKind.bool:
                return self.cond(value), out
            if out.kind == ScalarKind.int:
                return self.i64_of_index(self.idx(value)), out
            return self.flt(value), out
        if isinstance(value, sympy.Basic):
            value = (
                bool(value)
                if value in (sympy.true, sympy.false)
                else (int(value) if value.is_Integer else float(value))
            )
        if not isinstance(value, (bool, int, float)):
            raise Unsupported(f"constant {value!r}")
        return self.const(value, d), out

    def op_dropout(self, node: Node) -> H:
        raise Unsupported("dropout draws random numbers")

    # -- control flow -------------------------------------------------------------------
    def region(self, block: Block, args: Sequence[str], out_types: Sequence[Type], term: str) -> None:
        self.push()
        for a, s in zip(block.args, args):
            self.values[a.name] = (s, a.type)
        self.run_nodes(block.nodes)
        vals = [self.cast_to(*self.values[r.name], t) for r, t in zip(block.results, out_types)]
        if vals:
            self.emit(f"{term} {', '.join(vals)} : {', '.join(mlir_type(t) for t in out_types)}")
        else:
            self.emit(term)
        self.pop()

    def predicate(self, v: Value) -> str:
        s, t = self.values[v.name]
        if isinstance(t, ScalarType):
            return self.cvt(s, SCALAR_DTYPES[t.kind], DType.bool)
        zeros = ", ".join(self.cindex(0) for _ in t.shape)
        r = self.fresh()
        self.emit(f"{r} = tensor.extract {s}[{zeros}] : {mlir_type(t)}")
        return self.cvt(r, t.dtype, DType.bool)

    def op_if(self, node: Node) -> list[H]:
        c = self.predicate(node.inputs[0])
        outs = [self.fresh() for _ in node.outputs]
        types = [o.type for o in node.outputs]
        lhs = f"{', '.join(outs)} = " if outs else ""
        rt = f" -> ({', '.join(mlir_type(t) for t in types)})" if outs else ""
        self.emit(f"{lhs}scf.if {c}{rt} {{")
        self.region(node.regions[0], [], types, "scf.yield")
        self.emit("} else {")
        self.region(node.regions[1], [], types, "scf.yield")
        self.emit("}")
        return list(zip(outs, types))

    def op_for(self, node: Node) -> list[H]:
        start, stop, step = (self.index_of(*self._sv(v)) for v in node.inputs[:3])
        init = [self.values[v.name] for v in node.inputs[3:]]
        types = [o.type for o in node.outputs]
        var = symbol(str(node_attr(node, "var")))
        body = node.regions[0]
        step_const = self._const_of(node.inputs[2])
        direct = isinstance(step_const, int) and step_const > 0
        lb, ub, st = start, stop, step
        if not direct:
            # trip count n = max(0, ceil((stop - start) / step)); i = start + k * step
            diff = self._bin("subi", stop, start)
            n = self._bin("ceildivsi", diff, step)
            n = self._bin("maxsi", n, self.cindex(0))
            lb, ub, st = self.cindex(0), n, self.cindex(1)
        iv = self.fresh("i")
        args = [self.fresh("it") for _ in init]
        outs = [self.fresh() for _ in node.outputs]
        lhs = f"{', '.join(outs)} = " if outs else ""
        iters = ""
        if init:
            iters = (
                " iter_args("
                + ", ".join(f"{a} = {self.cast_to(v, t, ot)}" for a, (v, t), ot in zip(args, init, types))
                + ")"
            )
            iters += f" -> ({', '.join(mlir_type(t) for t in types)})"
        self.emit(f"{lhs}scf.for {iv} = {lb} to {ub} step {st}{iters} {{")
        self.push()
        index = iv
        if not direct:
            index = self._bin("addi", start, self._bin("muli", iv, step))
        self.remember(("sym", var), index)
        for a, s in zip(body.args, args):
            self.values[a.name] = (s, a.type)
        self.run_nodes(body.nodes)
        vals = [self.cast_to(*self.values[r.name], t) for r, t in zip(body.results, types)]
        if vals:
            self.emit(f"scf.yield {', '.join(vals)} : {', '.join(mlir_type(t) for t in types)}")
        self.pop()
        self.emit("}")
        return list(zip(outs, types))

    def _sv(self, v: Value) -> tuple[str, DType]:
        s, t = self.values[v.name]
        return s, dtype_of(t)

    def _const_of(self, v: Value) -> Any:
        for n in self.graph.walk():
            if v in n.outputs and n.op == "const":
                return n.attr("value")
        return None

    def op_while(self, node: Node) -> list[H]:
        init = [self.values[v.name] for v in node.inputs]
        types = [o.type for o in node.outputs]
        tys = ", ".join(mlir_type(t) for t in types)
        outs = [self.fresh() for _ in node.outputs]
        args = [self.fresh("w") for _ in init]
        lhs = f"{', '.join(outs)} = " if outs else ""
        inits = ", ".join(f"{a} = {self.cast_to(v, t, ot)}" for a, (v, t), ot in zip(args, init, types))
        self.emit(f"{lhs}scf.while ({inits}) : ({tys}) -> ({tys}) {{")
        cond, body = node.regions
        self.push()
        for a, s in zip(cond.args, args):
            self.values[a.name] = (s, a.type)
        self.run_nodes(cond.nodes)
        c = self.predicate(cond.results[0])
        self.emit(f"scf.condition({c}) {', '.join(args)} : {tys}")
        self.pop()
        bargs = [self.fresh("w") for _ in init]
        self.emit("} do {")
        self.emit("^bb0(" + ", ".join(f"{a}: {mlir_type(t)}" for a, t in zip(bargs, types)) + "):")
        self.region(body, bargs, types, "scf.yield")
        self.emit("}")
        return list(zip(outs, types))

    # -- the function -------------------------------------------------------------------
    def function(self) -> str:
        g = self.graph
        args = []
        for i, v in enumerate(g.inputs):
            a = f"%arg{i}"
            args.append(f"{a}: {mlir_type(v.type)}")
            self.values[v.name] = (a, v.type)
        self.indent = 4
        for v in g.inputs:
            if isinstance(v.type, TensorType):
                for j, d in enumerate(v.type.shape):
                    if isinstance(d, sympy.Symbol) and self.lookup(("sym", d)) is None:
                        r = self.fresh("d")
                        self.emit(
                            f"{r} = tensor.dim {self.values[v.name][0]}, {self.cindex(j)} : {mlir_type(v.type)}"
                        )
                        self.remember(("sym", d), r)
        self.run_nodes(g.nodes)
        self.node = None
        outs = [self.values[v.name][0] for v in g.outputs]
        out_types = [mlir_type(v.type) for v in g.outputs]
        self.emit(f"return {', '.join(outs)} : {', '.join(out_types)}" if outs else "return")
        name = re.sub(r"[^A-Za-z0-9_]", "_", g.name) or "main"
        head = (
            f"  func.func @{name}({', '.join(args)}) -> ({', '.join(out_types)}) "
            "attributes {llvm.emit_c_interface} {"
        )
        decls = []
        for (op, sig, attrs), fname in sorted(self.extern_decls.items(), key=lambda kv: kv[1]):
            ins, outs_t = sig.split(" -> ")
            decls.append(
                f"  func.func private @{fname}{ins} -> {outs_t} attributes "
                f"{{cuvil.op = {quote(op)}, cuvil.attrs = {quote(attrs)}}}"
            )
        return "\n".join(["module {", *decls, head, *self.lines, "  }", "}", ""])


#: the elementwise ops emitted by their scalar rule (:meth:`ElementwiseEmitter.scalar`): the
#: registry's elementwise primitives that have one (see [Note: MLIR elementwise rules]); an
#: elementwise op with a decomposition (gelu, silu ...) is emitted from it
_ELEMENTWISE = frozenset(op for op in elementwise_primitives() if op in TYPED or op in ARITH)


def mlir_fallback(op: str) -> Decomposition | None:
    """The fallback decomposition (:mod:`cuvil_ir.graph_ir.fallbacks`) emitted for the
    primitive ``op`` MLIR has no emitter of its own for (sdpa): none for an op with a
    decomposition of its own or one whose declaration refuses MLIR. The primitives MLIR
    does emit (rsqrt, log1p ... as ``math`` ops) never reach it."""
    decl = REGISTRY.get(op) if op in REGISTRY else None
    if decl is None or decl.decompose is not None or "mlir" in decl.extern_reasons:
        return None
    return fallback(op)


def to_mlir_text(graph: Graph) -> tuple[str, dict[str, str]]:
    """The unverified MLIR text and the ops emitted as external calls (op -> reason)."""
    e = _Emitter(graph)
    text = e.function()
    return text, dict(sorted(e.externs.items()))


def to_mlir(graph: Graph) -> MlirResult:
    """Emit ``graph`` as an upstream MLIR module, parsed and verified by the MLIR bindings."""
    from cuvil_ir.mlir.bindings import load

    text, externs = to_mlir_text(graph)
    b = load()
    with b.ir.Context():
        try:
            module = b.ir.Module.parse(text)
        except Exception as exc:  # MLIRError from the bindings
            raise MlirError(f"{graph.name}: the emitted module does not parse: {exc}\n{text}") from exc
        if not module.operation.verify():
            raise MlirError(f"{graph.name}: the emitted module does not verify\n{text}")
        printed = str(module)
    return MlirResult(printed, sorted(externs), externs)
