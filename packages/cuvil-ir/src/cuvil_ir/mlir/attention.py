"""Scaled-dot-product attention: ``q k^T * scale`` (+ a mask or the causal triangle as
``-inf``), a softmax over the last dim, ``@ v``."""

from __future__ import annotations

import math

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType
from cuvil_ir.mlir.linalg import LinalgEmitter
from cuvil_ir.mlir.module import H, Unsupported, node_attr


class AttentionEmitter(LinalgEmitter):
    """sdpa."""

    def softmax(self, x: H, dim: int, log: bool, od: DType) -> H:
        t = x[1]
        assert isinstance(t, TensorType)
        cd = DType.f32 if od in (DType.f16, DType.bf16) else od
        ct = t.replace(dtype=cd)
        if t.dtype != cd:
            x = self.ew(ct, [x], "cast")
        m = self.reduce(x, [dim], True, "max")
        sh = self.ew(ct, [x, m], "sub")
        e = self.ew(ct, [sh], "exp")
        s = self.reduce(e, [dim], True, "sum")
        if log:
            ls = self.ew(s[1], [s], "log")  # type: ignore[arg-type]
            return self.ew(ct.replace(dtype=od), [sh, ls], "sub")
        return self.ew(ct.replace(dtype=od), [e, s], "div")

    def op_sdpa(self, node: Node) -> H:
        if node_attr(node, "enable_gqa"):
            raise Unsupported("sdpa with enable_gqa")
        q, k, v, *mask = self.ins(node)
        out = node.output.type
        qt, kt = q[1], k[1]
        assert isinstance(out, TensorType) and isinstance(qt, TensorType) and isinstance(kt, TensorType)
        L, S, E = qt.shape[-2], kt.shape[-2], qt.shape[-1]
        st = TensorType(out.dtype, tuple(out.shape[:-2]) + (L, S), out.device)
        s = self.contract(q, k, st, b_transposed=True)
        scale = node_attr(node, "scale")
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
        if node_attr(node, "is_causal"):
            s = self.tri(s, 0, lower=True, fill=-math.inf)
        p = self.softmax(s, st.rank - 1, False, st.dtype)
        return self.named_matmul(p, v, out) or self.contract(p, v, out)


__all__ = ["AttentionEmitter"]
