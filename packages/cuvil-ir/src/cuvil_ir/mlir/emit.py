"""Graph IR -> upstream MLIR (func, arith, math, tensor, linalg, scf).

The module is written as MLIR assembly text, then parsed and verified by the real
bindings (:mod:`cuvil_ir.mlir.bindings`); the text returned is the one MLIR prints.
Ops without an upstream equivalent become ``func.call`` s of declared external
functions ``@cuvil_extern_<op>_<n>`` and are listed in :attr:`MlirResult.externs`.
See ``docs/cuvil-ir-and-mlir.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from cuvil_ir.graph_ir.decompose import NotDecomposed, expand, uses_decomposition
from cuvil_ir.graph_ir.nodes import Block, Graph, Node, Value
from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.mlir.base import (
    EmitterBase,
    H,
    MlirError,
    _attr,
    _attr_text,
    _dim,
    _q,
    _Unsupported,
    dtype_of,
    elem,
    mlir_type,
)
from cuvil_ir.symbolic import Dim, symbol

#: reduction op -> combiner kind of its linalg.generic
_REDUCTIONS = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "all": "all", "any": "any"}


@dataclass
class MlirResult:
    text: str
    externs: list[str]
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def lowerable(self) -> bool:
        return not self.externs


class _Emitter(EmitterBase):
    """Emits nodes (one ``op_<name>`` method per op family), regions and the function."""

    # -- nodes ----------------------------------------------------------------------------
    def extern(self, node: Node, reason: str) -> None:
        label = node.op if node.op != "extern" else f"extern:{_attr(node, 'target')}"
        self.externs.setdefault(label, reason)
        ins = [(self.values[v.name][0], v.type) for v in node.inputs]
        in_types = ", ".join(mlir_type(t) for _, t in ins)
        out_types = ", ".join(mlir_type(o.type) for o in node.outputs)
        attrs = ", ".join(f"{k} = {_attr_text(v)}" for k, v in node.attrs)
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
        family, or (for a composite op without one) :meth:`op_decomposed`."""
        fn: Callable[[Node], Any] | None = getattr(self, "op_" + op, None)
        if fn is None and op in _ELEMENTWISE:
            fn = self.op_elementwise
        if fn is None and op in _REDUCTIONS:
            fn = self.op_reduction
        if fn is None and uses_decomposition(op, "mlir", native=False):
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
            except _Unsupported as e:
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
        op each; the oracle needs no fusion). A primitive without an emitter makes
        the whole node one external call."""
        try:
            ex = expand(node, self.graph.assumptions)
        except NotDecomposed as e:
            raise _Unsupported(str(e)) from None
        for m in ex.nodes:
            fn = self.emitter_for(m.op)
            if fn is None:
                raise _Unsupported(f"its primitive {m.op} is not emitted")
            self.node = m
            self.bind(m, fn(m))
        self.node = node
        return [self.values[v.name] for v in ex.outputs]

    def ins(self, node: Node) -> list[H]:
        return [self.values[v.name] for v in node.inputs]

    def op_elementwise(self, node: Node) -> H:
        out = node.output.type
        attrs = dict(node.attrs)
        operands = self.ins(node)
        if isinstance(out, ScalarType):
            d = SCALAR_DTYPES[out.kind]
            return self.scalar(node.op, [(v, dtype_of(t)) for v, t in operands], d, attrs), out
        return self.ew(out, operands, node.op, **attrs)

    def op_const(self, node: Node) -> H:
        out = node.output.type
        value = _attr(node, "value")
        if isinstance(out, TensorType):
            raise _Unsupported("tensor constants are not emitted")
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
            raise _Unsupported(f"constant {value!r}")
        return self.const(value, d), out

    def _dims_attr(self, node: Node, name: str = "dims") -> list[int]:
        t = node.inputs[0].type
        assert isinstance(t, TensorType)
        dims = _attr(node, name)
        if dims is None:
            return list(range(t.rank))
        if isinstance(dims, int):
            return [dims % max(t.rank, 1)]
        return [int(d) % max(t.rank, 1) for d in dims]

    def _reduction(self, node: Node, kind: str) -> H:
        x = self.ins(node)[0]
        out = node.output.type
        assert isinstance(out, TensorType)
        r = self.reduce(x, self._dims_attr(node), bool(_attr(node, "keepdim")), kind, out.dtype)
        return r

    def op_reduction(self, node: Node) -> H:
        """sum, prod, amax, amin, all, any: one ``linalg.generic`` reduction each."""
        return self._reduction(node, _REDUCTIONS[node.op])

    def op_mean(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x = self.ins(node)[0]
        return self.mean(x, self._dims_attr(node), bool(_attr(node, "keepdim")), out.dtype)

    def _arg(self, node: Node, kind: str, with_values: bool) -> list[H]:
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dim = _attr(node, "dim")
        if dim is None:
            raise _Unsupported(f"{node.op} without dim")
        dim = int(dim) % t.rank
        keep = bool(_attr(node, "keepdim"))
        vout = node.outputs[0].type if with_values else node.output.type.replace(dtype=t.dtype)  # type: ignore[union-attr]
        iout = node.outputs[-1].type
        assert isinstance(vout, TensorType) and isinstance(iout, TensorType)
        init = -math.inf if kind == "max" else math.inf
        if not t.dtype.is_floating:
            init = -(2**63) if kind == "max" else 2**63 - 1
            if t.dtype != DType.i64:
                raise _Unsupported(f"{node.op} on {t.dtype.value}")
        vacc = self.filled(vout, init)
        iacc = self.filled(iout, 0)
        rank = t.rank
        omap = ", ".join("0" if i == dim else f"d{i}" for i in range(rank) if keep or i != dim)
        ident = ", ".join(f"d{i}" for i in range(rank))
        its = ["reduction" if i == dim else "parallel" for i in range(rank)]
        d = t.dtype

        def body(a: list[str], o: list[str]) -> list[str]:
            better = self.cmp("gt" if kind == "max" else "lt", a[0], o[0], d)
            i = self.index_in_body(dim)
            i64 = self.i64_of_index(i)
            return [self.select(better, a[0], o[0], d), self.select(better, i64, o[1], DType.i64)]

        vs = self.generic([(vacc, vout, omap), (iacc, iout, omap)], [(x[0], t, ident)], rank, its, body)
        res: list[H] = [(vs[0], vout), (vs[1], iout)]
        return res if with_values else [res[1]]

    def op_argmax(self, node: Node) -> list[H]:
        return self._arg(node, "max", False)

    def op_argmin(self, node: Node) -> list[H]:
        return self._arg(node, "min", False)

    def op_max(self, node: Node) -> list[H]:
        return self._arg(node, "max", True)

    def op_min(self, node: Node) -> list[H]:
        return self._arg(node, "min", True)

    def op_matmul(self, node: Node) -> H:
        a, b = self.ins(node)
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.named_matmul(a, b, out) or self.contract(a, b, out)

    def op_linear(self, node: Node) -> H:
        x, w, *bias = self.ins(node)
        out = node.output.type
        assert isinstance(out, TensorType)
        y = self.contract(x, w, out, b_transposed=True)
        if bias:
            y = self.ew(out, [y, bias[0]], "add")
        return y

    def op_sdpa(self, node: Node) -> H:
        if _attr(node, "enable_gqa"):
            raise _Unsupported("sdpa with enable_gqa")
        q, k, v, *mask = self.ins(node)
        out = node.output.type
        qt, kt = q[1], k[1]
        assert isinstance(out, TensorType) and isinstance(qt, TensorType) and isinstance(kt, TensorType)
        L, S, E = qt.shape[-2], kt.shape[-2], qt.shape[-1]
        st = TensorType(out.dtype, tuple(out.shape[:-2]) + (L, S), out.device)
        s = self.contract(q, k, st, b_transposed=True)
        scale = _attr(node, "scale")
        sc: float | sympy.Basic = (
            float(scale) if isinstance(scale, (int, float)) else sympy.sympify(E) ** sympy.Rational(-1, 2)
        )
        s = self.ew(st, [s, self.fconst(sc, st.dtype)], "mul")
        ninf = (self.const(-math.inf, DType.f64), ScalarType(ScalarKind.float))
        if mask:
            mt = mask[0][1]
            assert isinstance(mt, TensorType)
            if mt.dtype == DType.bool:
                s = self.ew(st, [mask[0], s, ninf], "where")
            else:
                s = self.ew(st, [s, mask[0]], "add")
        if _attr(node, "is_causal"):
            s = self.tri(s, 0, lower=True, fill=-math.inf)
        p = self.softmax(s, st.rank - 1, False, st.dtype)
        return self.named_matmul(p, v, out) or self.contract(p, v, out)

    def tri(self, x: H, diagonal: int, lower: bool, fill: float | int | bool = 0) -> H:
        v, t = x
        assert isinstance(t, TensorType)
        r = t.rank
        e = self.empty(t)
        ident = ", ".join(f"d{i}" for i in range(r))

        def body(a: list[str], _o: list[str]) -> list[str]:
            i, j = self.index_in_body(r - 2), self.index_in_body(r - 1)
            diff = self._bin("subi", j, i)
            keep = self.fresh()
            self.emit(
                f"{keep} = arith.cmpi {'sle' if lower else 'sge'}, {diff}, {self.cindex(diagonal)} : index"
            )
            return [self.select(keep, a[0], self.const(fill, t.dtype), t.dtype)]

        return self.generic([(e, t, ident)], [(v, t, ident)], r, ["parallel"] * r, body)[0], t

    def op_tril(self, node: Node) -> H:
        return self.tri(self.ins(node)[0], int(_attr(node, "diagonal") or 0), True)

    def op_triu(self, node: Node) -> H:
        return self.tri(self.ins(node)[0], int(_attr(node, "diagonal") or 0), False)

    def op_permute(self, node: Node) -> H:
        (v, t), out = self.ins(node)[0], node.output.type
        assert isinstance(out, TensorType)
        e = self.empty(out)
        perm = ", ".join(str(int(p)) for p in _attr(node, "perm"))
        r = self.fresh()
        self.emit(
            f"{r} = linalg.transpose ins({v} : {mlir_type(t)}) outs({e} : {mlir_type(out)}) permutation = [{perm}]"
        )
        return r, out

    def _reshape_node(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.reshape(self.ins(node)[0], out)

    op_reshape = _reshape_node
    op_unsqueeze = _reshape_node
    op_squeeze = _reshape_node

    def op_expand(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.ew(out, [self.ins(node)[0]], "cast")

    def _norm_index(self, i: Any, size: Dim) -> Dim:
        if isinstance(i, int) and i < 0:
            return _dim(sympy.Max(0, sympy.sympify(size) + i))
        if isinstance(i, int) and isinstance(size, int):
            return min(i, size)
        return _dim(i)

    def op_slice(self, node: Node) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        dim = int(_attr(node, "dim")) % t.rank
        start = _attr(node, "start")
        step = int(_attr(node, "step") or 1)
        off = 0 if start is None else self._norm_index(start, t.shape[dim])
        offs: list[Dim] = [0] * t.rank
        offs[dim] = off
        strides = [1] * t.rank
        strides[dim] = step
        return self.extract_slice(x, offs, list(out.shape), strides, out)

    def op_select(self, node: Node) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        dim = int(_attr(node, "dim")) % t.rank
        index = _attr(node, "index")
        if isinstance(index, int) and index < 0:
            off: Dim = _dim(sympy.sympify(t.shape[dim]) + index)
        else:
            off = _dim(index)
        offs: list[Dim] = [0] * t.rank
        offs[dim] = off
        sizes = list(t.shape)
        sizes[dim] = 1
        return self.extract_slice(x, offs, sizes, [1] * t.rank, out)

    def op_split(self, node: Node) -> list[H]:
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dim = int(_attr(node, "dim")) % t.rank
        res = []
        off: Any = 0
        for o in node.outputs:
            ot = o.type
            assert isinstance(ot, TensorType)
            offs: list[Dim] = [0] * t.rank
            offs[dim] = _dim(off)
            res.append(self.extract_slice(x, offs, list(ot.shape), [1] * t.rank, ot))
            off = sympy.sympify(off) + ot.shape[dim]
        return res

    def op_cat(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        dim = int(_attr(node, "dim")) % out.rank
        acc = self.empty(out)
        off: Any = 0
        for v, t in self.ins(node):
            assert isinstance(t, TensorType)
            if t.rank != out.rank:
                if t.shape == (0,):
                    continue
                raise _Unsupported("cat of tensors of different ranks")
            if t.dtype != out.dtype:
                v, t = self.ew(t.replace(dtype=out.dtype), [(v, t)], "cast")
            assert isinstance(t, TensorType)
            offs: list[Dim] = [0] * out.rank
            offs[dim] = _dim(off)
            r = self.fresh()
            self.emit(
                f"{r} = tensor.insert_slice {v} into {acc}{self.mixed(offs)}{self.mixed(list(t.shape))}"
                f"{self.mixed([1] * out.rank)} : {mlir_type(t)} into {mlir_type(out)}"
            )
            acc = r
            off = sympy.sympify(off) + t.shape[dim]
        return acc, out

    def gather(self, out: TensorType, src: H, index_fn: Callable[[list[str]], list[str]]) -> H:
        """out[i...] = src[index_fn(i...)] as a generic with tensor.extract."""
        v, t = src
        e = self.empty(out)
        ident = ", ".join(f"d{i}" for i in range(out.rank))

        def body(_a: list[str], _o: list[str]) -> list[str]:
            ii = [self.index_in_body(i) for i in range(out.rank)]
            src_idx = index_fn(ii)
            r = self.fresh()
            self.emit(f"{r} = tensor.extract {v}[{', '.join(src_idx)}] : {mlir_type(t)}")
            return [r]

        return self.generic([(e, out, ident)], [], out.rank, ["parallel"] * out.rank, body)[0], out

    def op_flip(self, node: Node) -> H:
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dims = self._dims_attr(node)

        def fn(ii: list[str]) -> list[str]:
            res = []
            for i, v in enumerate(ii):
                if i in dims:
                    last = self.idx(sympy.sympify(t.shape[i]) - 1)
                    v = self._bin("subi", last, v)
                res.append(v)
            return res

        return self.gather(t, x, fn)

    def op_repeat(self, node: Node) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        off = out.rank - t.rank

        def fn(ii: list[str]) -> list[str]:
            return [self._bin("remsi", ii[off + i], self.idx(d)) for i, d in enumerate(t.shape)]

        return self.gather(out, x, fn)

    def op_embedding(self, node: Node) -> H:
        (iv, it), (tv, tt) = self.ins(node)
        out = node.output.type
        assert isinstance(out, TensorType) and isinstance(it, TensorType) and isinstance(tt, TensorType)
        e = self.empty(out)
        r = out.rank
        ident = ", ".join(f"d{i}" for i in range(r))
        imap = ", ".join(f"d{i}" for i in range(r - 1))

        def body(a: list[str], _o: list[str]) -> list[str]:
            i = self.index_of(a[0], it.dtype)
            j = self.index_in_body(r - 1)
            y = self.fresh()
            self.emit(f"{y} = tensor.extract {tv}[{i}, {j}] : {mlir_type(tt)}")
            return [y]

        return self.generic([(e, out, ident)], [(iv, it, imap)], r, ["parallel"] * r, body)[0], out

    def op_full(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        value = _attr(node, "value")
        if not isinstance(value, (int, float, bool)):
            raise _Unsupported(f"full with value {value!r}")
        return self.filled(out, value), out

    def op_arange(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        start, step = _attr(node, "start"), _attr(node, "step")
        e = self.empty(out)

        def body(_a: list[str], _o: list[str]) -> list[str]:
            i = self.index_in_body(0)
            if out.dtype.is_floating:
                fi = self.fresh()
                self.emit(f"{fi} = arith.sitofp {self.i64_of_index(i)} : i64 to f64")
                s0 = self.fconst(start if start is not None else 0, DType.f64)[0]
                st = self.fconst(step if step is not None else 1, DType.f64)[0]
                y = self.add(s0, self.mul(fi, st, DType.f64), DType.f64)
                return [self.cvt(y, DType.f64, out.dtype)]
            y = self._bin("addi", self.idx(start or 0), self._bin("muli", i, self.idx(step or 1)))
            return [self.cvt(self.i64_of_index(y), DType.i64, out.dtype)]

        ident = "d0"
        return self.generic([(e, out, ident)], [], 1, ["parallel"], body)[0], out

    def op_pad(self, node: Node) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        if _attr(node, "mode") != "constant":
            raise _Unsupported(f"pad mode {_attr(node, 'mode')}")
        pad = [p for p in _attr(node, "pad")]
        if any(not isinstance(p, int) or p < 0 for p in pad):
            raise _Unsupported("negative or symbolic padding")
        value = _attr(node, "value")
        return self.pad(x, pad, float(value) if value is not None else 0.0, out)

    def pad(self, x: H, pad: Sequence[int], value: float, out: TensorType) -> H:
        """torch-order pads (last dim first, (lo, hi) pairs)."""
        v, t = x
        assert isinstance(t, TensorType)
        lo, hi = [0] * t.rank, [0] * t.rank
        for i in range(len(pad) // 2):
            lo[t.rank - 1 - i] = pad[2 * i]
            hi[t.rank - 1 - i] = pad[2 * i + 1]
        c = self.const(value if t.dtype.is_floating else int(value), t.dtype)
        r = self.fresh()
        args = ", ".join(f"{self.fresh('i')}: index" for _ in range(t.rank))
        self.emit(f"{r} = tensor.pad {v} low{lo} high{hi} {{")
        self.emit(f"^bb0({args}):")
        self.emit(f"  tensor.yield {c} : {elem(t.dtype)}")
        self.emit(f"}} : {mlir_type(t)} to {mlir_type(out)}")
        return r, out

    def _padded_type(self, t: TensorType, p: Sequence[int]) -> TensorType:
        shape = list(t.shape[:2]) + [_dim(sympy.sympify(d) + 2 * q) for d, q in zip(t.shape[2:], p)]
        return t.replace(shape=tuple(shape))

    def op_conv(self, node: Node) -> H:
        x, w, *bias = self.ins(node)
        out = node.output.type
        t, wt = x[1], w[1]
        assert isinstance(out, TensorType) and isinstance(t, TensorType) and isinstance(wt, TensorType)
        padding = _attr(node, "padding")
        if t.rank != 4 or _attr(node, "groups") != 1 or not isinstance(padding, tuple):
            raise _Unsupported("only 2-D convolutions with groups = 1 and explicit padding map to linalg")
        if not all(isinstance(p, int) for p in padding) or t.dtype not in (DType.f32, DType.f64):
            raise _Unsupported("symbolic padding or a non-f32/f64 convolution")
        if any(padding):
            pt = self._padded_type(t, padding)
            x = self.pad(x, [q for p in reversed(padding) for q in (p, p)], 0.0, pt)
            t = pt
        acc = self.filled(out, 0)
        st = ", ".join(str(s) for s in _attr(node, "stride"))
        dl = ", ".join(str(s) for s in _attr(node, "dilation"))
        r = self.fresh()
        self.emit(
            f"{r} = linalg.conv_2d_nchw_fchw {{dilations = dense<[{dl}]> : tensor<2xi64>, "
            f"strides = dense<[{st}]> : tensor<2xi64>}} ins({x[0]}, {w[0]} : {mlir_type(t)}, {mlir_type(wt)}) "
            f"outs({acc} : {mlir_type(out)}) -> {mlir_type(out)}"
        )
        y: H = (r, out)
        if bias:
            bt = bias[0][1]
            assert isinstance(bt, TensorType)
            y = self.ew(
                out, [y, self.reshape(bias[0], TensorType(bt.dtype, (bt.shape[0], 1, 1), bt.device))], "add"
            )
        return y

    def op_max_pool(self, node: Node) -> H:
        return self._pool(node, "max")

    def op_avg_pool(self, node: Node) -> H:
        return self._pool(node, "sum")

    def _pool(self, node: Node, kind: str) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        if t.rank != 4 or _attr(node, "ceil_mode") or t.dtype not in (DType.f32, DType.f64):
            raise _Unsupported("only 2-D f32/f64 pooling without ceil_mode maps to linalg")
        ks, padding = _attr(node, "kernel_size"), _attr(node, "padding")
        stride = _attr(node, "stride") or ks
        dil = _attr(node, "dilation") or (1, 1)
        if kind == "sum" and (
            _attr(node, "divisor_override") is not None
            or (any(padding) and not _attr(node, "count_include_pad"))
        ):
            raise _Unsupported("avg_pool with divisor_override or count_include_pad = false and padding")
        if any(padding):
            pt = self._padded_type(t, padding)
            x = self.pad(
                x, [q for p in reversed(padding) for q in (p, p)], -math.inf if kind == "max" else 0.0, pt
            )
            t = pt
        acc = self.filled(out, -math.inf if kind == "max" else 0.0)
        win = TensorType(t.dtype, tuple(ks), t.device)
        we = self.empty(win)
        r = self.fresh()
        st = ", ".join(str(s) for s in stride)
        dl = ", ".join(str(s) for s in dil)
        self.emit(
            f"{r} = linalg.pooling_nchw_{kind} {{dilations = dense<[{dl}]> : tensor<2xi64>, "
            f"strides = dense<[{st}]> : tensor<2xi64>}} ins({x[0]}, {we} : {mlir_type(t)}, {mlir_type(win)}) "
            f"outs({acc} : {mlir_type(out)}) -> {mlir_type(out)}"
        )
        if kind == "sum":
            return self.ew(out, [(r, out), self.fconst(float(ks[0] * ks[1]), t.dtype)], "div")
        return r, out

    def op_adaptive_avg_pool(self, node: Node) -> H:
        if tuple(_attr(node, "output_size") or ()) != (1, 1):
            raise _Unsupported("adaptive_avg_pool to a size other than (1, 1)")
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.mean(self.ins(node)[0], [2, 3], True, out.dtype)

    def op_dropout(self, node: Node) -> H:
        raise _Unsupported("dropout draws random numbers")

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
        var = symbol(str(_attr(node, "var")))
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
                f"{{cuvil.op = {_q(op)}, cuvil.attrs = {_q(attrs)}}}"
            )
        return "\n".join(["module {", *decls, head, *self.lines, "  }", "}", ""])


#: the primitive elementwise ops :meth:`EmitterBase.scalar` implements (composite ones such as
#: gelu or silu are emitted from their decompositions)
_ELEMENTWISE = {
    "abs", "add", "atan", "atan2", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "cast",
    "ceil", "clamp", "cos", "div", "eq", "erf", "exp", "expm1", "floor", "floor_divide", "fmod",
    "ge", "gt", "le", "log", "log1p", "log2", "logical_and", "logical_not", "logical_or", "logical_xor",
    "lt", "maximum", "minimum", "mul", "ne", "neg", "pow", "reciprocal", "relu", "remainder", "round",
    "rsqrt", "sigmoid", "sign", "sin", "sqrt", "square", "sub", "tan", "tanh", "trunc", "where",
}  # fmt: skip


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
