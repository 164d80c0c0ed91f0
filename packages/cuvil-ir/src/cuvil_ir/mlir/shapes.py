"""Shape and data movement ops: reshape, permute, expand, slicing (slice, select,
split), cat, gathers (flip, repeat, embedding), triangles (tril/triu), factories
(full, arange) and constant padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.mlir.module import H, Unsupported, as_dim, elem, mlir_type, node_attr
from cuvil_ir.mlir.reductions import ReductionEmitter
from cuvil_ir.symbolic import Dim


class ShapeEmitter(ReductionEmitter):
    """Views, slices, gathers, factories and padding."""

    def reshape(self, x: H, out: TensorType) -> H:
        v, t = x
        if mlir_type(t) == mlir_type(out) and t == out:
            return x
        s = self.fresh()
        dims = [self.idx(d) for d in out.shape]
        self.emit(f"{s} = tensor.from_elements {', '.join(dims)} : tensor<{out.rank}xindex>")
        r = self.fresh()
        self.emit(
            f"{r} = tensor.reshape {v}({s}) : ({mlir_type(t)}, tensor<{out.rank}xindex>) -> {mlir_type(out)}"
        )
        return r, out

    def mixed(self, vals: Sequence[Dim | sympy.Basic]) -> str:
        out = []
        for v in vals:
            if isinstance(v, (int, sympy.Integer)):
                out.append(str(int(v)))
            else:
                out.append(self.idx(v))
        return "[" + ", ".join(out) + "]"

    def extract_slice(
        self, x: H, offsets: Sequence[Dim], sizes: Sequence[Dim], strides: Sequence[int], out: TensorType
    ) -> H:
        v, t = x
        r = self.fresh()
        self.emit(
            f"{r} = tensor.extract_slice {v}{self.mixed(offsets)}{self.mixed(sizes)}{self.mixed(strides)} : "
            f"{mlir_type(t)} to {mlir_type(out)}"
        )
        return r, out

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
        return self.tri(self.ins(node)[0], int(node_attr(node, "diagonal") or 0), True)

    def op_triu(self, node: Node) -> H:
        return self.tri(self.ins(node)[0], int(node_attr(node, "diagonal") or 0), False)

    def op_permute(self, node: Node) -> H:
        (v, t), out = self.ins(node)[0], node.output.type
        assert isinstance(out, TensorType)
        e = self.empty(out)
        perm = ", ".join(str(int(p)) for p in node_attr(node, "perm"))
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
            return as_dim(sympy.Max(0, sympy.sympify(size) + i))
        if isinstance(i, int) and isinstance(size, int):
            return min(i, size)
        return as_dim(i)

    def op_slice(self, node: Node) -> H:
        x = self.ins(node)[0]
        t, out = x[1], node.output.type
        assert isinstance(t, TensorType) and isinstance(out, TensorType)
        dim = int(node_attr(node, "dim")) % t.rank
        start = node_attr(node, "start")
        step = int(node_attr(node, "step") or 1)
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
        dim = int(node_attr(node, "dim")) % t.rank
        index = node_attr(node, "index")
        if isinstance(index, int) and index < 0:
            off: Dim = as_dim(sympy.sympify(t.shape[dim]) + index)
        else:
            off = as_dim(index)
        offs: list[Dim] = [0] * t.rank
        offs[dim] = off
        sizes = list(t.shape)
        sizes[dim] = 1
        return self.extract_slice(x, offs, sizes, [1] * t.rank, out)

    def op_split(self, node: Node) -> list[H]:
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dim = int(node_attr(node, "dim")) % t.rank
        res = []
        off: Any = 0
        for o in node.outputs:
            ot = o.type
            assert isinstance(ot, TensorType)
            offs: list[Dim] = [0] * t.rank
            offs[dim] = as_dim(off)
            res.append(self.extract_slice(x, offs, list(ot.shape), [1] * t.rank, ot))
            off = sympy.sympify(off) + ot.shape[dim]
        return res

    def op_cat(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        dim = int(node_attr(node, "dim")) % out.rank
        acc = self.empty(out)
        off: Any = 0
        for v, t in self.ins(node):
            assert isinstance(t, TensorType)
            if t.rank != out.rank:
                if t.shape == (0,):
                    continue
                raise Unsupported("cat of tensors of different ranks")
            if t.dtype != out.dtype:
                v, t = self.ew(t.replace(dtype=out.dtype), [(v, t)], "cast")
            assert isinstance(t, TensorType)
            offs: list[Dim] = [0] * out.rank
            offs[dim] = as_dim(off)
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
        value = node_attr(node, "value")
        if not isinstance(value, (int, float, bool)):
            raise Unsupported(f"full with value {value!r}")
        return self.filled(out, value), out

    def op_arange(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        start, step = node_attr(node, "start"), node_attr(node, "step")
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
        if node_attr(node, "mode") != "constant":
            raise Unsupported(f"pad mode {node_attr(node, 'mode')}")
        pad = [p for p in node_attr(node, "pad")]
        if any(not isinstance(p, int) or p < 0 for p in pad):
            raise Unsupported("negative or symbolic padding")
        value = node_attr(node, "value")
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


__all__ = ["ShapeEmitter"]
