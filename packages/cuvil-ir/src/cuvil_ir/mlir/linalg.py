"""Contractions and windows: matmul and linear (``linalg.matmul``/``batch_matmul`` or a
contraction generic), 2-D convolution and pooling (``linalg.conv_2d_nchw_fchw``,
``linalg.pooling_nchw_*``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.mlir.module import H, Unsupported, as_dim, mlir_type, node_attr
from cuvil_ir.mlir.shapes import ShapeEmitter


class LinalgEmitter(ShapeEmitter):
    """Matmul, linear, convolution and pooling."""

    def contract(self, a: H, b: H, out: TensorType, b_transposed: bool = False) -> H:
        """torch.matmul semantics (``b`` given as (..., n, k) when ``b_transposed``)."""
        av, at = a
        bv, bt = b
        assert isinstance(at, TensorType) and isinstance(bt, TensorType)
        ar, br = at.rank, bt.rank
        has_m, has_n = ar >= 2, br >= 2
        nb = out.rank - int(has_m) - int(has_n)
        loops = out.rank + 1
        k = f"d{loops - 1}"
        m = f"d{nb}" if has_m else None
        n = f"d{nb + int(has_m)}" if has_n else None

        def batch(t: TensorType, inner: int) -> list[str]:
            tb = t.rank - inner
            res = []
            for i in range(tb):
                j = nb - tb + i
                res.append("0" if self.is_one(t.shape[i]) and not self.is_one(out.shape[j]) else f"d{j}")
            return res

        amap = batch(at, 2 if has_m else 1) + ([m] if m else []) + [k]
        if b_transposed:
            bmap = batch(bt, 2 if has_n else 1) + ([n] if n else []) + [k]
        else:
            bmap = batch(bt, 2 if has_n else 1) + [k] + ([n] if n else [])
        omap = ", ".join(f"d{i}" for i in range(out.rank))
        cd = DType.f32 if out.dtype in (DType.f16, DType.bf16) else out.dtype
        acc_t = out.replace(dtype=cd)
        acc = self.filled(acc_t, 0)
        its = ["parallel"] * out.rank + ["reduction"]

        def body(x: list[str], o: list[str]) -> list[str]:
            p = self.mul(self.cvt(x[0], at.dtype, cd), self.cvt(x[1], bt.dtype, cd), cd)
            return [self.add(o[0], p, cd)]

        ins = [(av, at, ", ".join(amap)), (bv, bt, ", ".join(s for s in bmap if s))]
        r = self.generic([(acc, acc_t, omap)], ins, loops, its, body)[0]
        if cd != out.dtype:
            return self.ew(out, [(r, acc_t)], "cast")
        return r, out

    def named_matmul(self, a: H, b: H, out: TensorType) -> H | None:
        at, bt = a[1], b[1]
        assert isinstance(at, TensorType) and isinstance(bt, TensorType)
        if not (at.dtype == bt.dtype == out.dtype and out.dtype in (DType.f32, DType.f64)):
            return None
        if at.rank == bt.rank == 2:
            name = "matmul"
        elif at.rank == bt.rank == 3 and at.shape[0] == bt.shape[0] == out.shape[0]:
            name = "batch_matmul"
        else:
            return None
        acc = self.filled(out, 0)
        r = self.fresh()
        self.emit(
            f"{r} = linalg.{name} ins({a[0]}, {b[0]} : {mlir_type(at)}, {mlir_type(bt)}) "
            f"outs({acc} : {mlir_type(out)}) -> {mlir_type(out)}"
        )
        return r, out

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

    def _padded_type(self, t: TensorType, p: Sequence[int]) -> TensorType:
        shape = list(t.shape[:2]) + [as_dim(sympy.sympify(d) + 2 * q) for d, q in zip(t.shape[2:], p)]
        return t.replace(shape=tuple(shape))

    def op_conv(self, node: Node) -> H:
        x, w, *bias = self.ins(node)
        out = node.output.type
        t, wt = x[1], w[1]
        assert isinstance(out, TensorType) and isinstance(t, TensorType) and isinstance(wt, TensorType)
        padding = node_attr(node, "padding")
        if t.rank != 4 or node_attr(node, "groups") != 1 or not isinstance(padding, tuple):
            raise Unsupported("only 2-D convolutions with groups = 1 and explicit padding map to linalg")
        if not all(isinstance(p, int) for p in padding) or t.dtype not in (DType.f32, DType.f64):
            raise Unsupported("symbolic padding or a non-f32/f64 convolution")
        if any(padding):
            pt = self._padded_type(t, padding)
            x = self.pad(x, [q for p in reversed(padding) for q in (p, p)], 0.0, pt)
            t = pt
        acc = self.filled(out, 0)
        st = ", ".join(str(s) for s in node_attr(node, "stride"))
        dl = ", ".join(str(s) for s in node_attr(node, "dilation"))
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
        if t.rank != 4 or node_attr(node, "ceil_mode") or t.dtype not in (DType.f32, DType.f64):
            raise Unsupported("only 2-D f32/f64 pooling without ceil_mode maps to linalg")
        ks, padding = node_attr(node, "kernel_size"), node_attr(node, "padding")
        stride = node_attr(node, "stride") or ks
        dil = node_attr(node, "dilation") or (1, 1)
        if kind == "sum" and (
            node_attr(node, "divisor_override") is not None
            or (any(padding) and not node_attr(node, "count_include_pad"))
        ):
            raise Unsupported("avg_pool with divisor_override or count_include_pad = false and padding")
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
        if tuple(node_attr(node, "output_size") or ()) != (1, 1):
            raise Unsupported("adaptive_avg_pool to a size other than (1, 1)")
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.mean(self.ins(node)[0], [2, 3], True, out.dtype)


__all__ = ["LinalgEmitter"]
