"""Scaled-dot-product attention: ``q k^T * scale`` (+ a mask or the causal triangle as
``-inf``), a softmax over the last dim, ``@ v``.

The softmax is the registry's ``softmax`` op, emitted from its decomposition. sdpa itself
has no decomposition yet (its shape rule does not relate the batch dims of q, k and v:
see ``ScaledDotProductAttention`` in :mod:`cuvil_ir.graph_ir.ops.nn`), so the contractions
around the softmax are written here; once it has one, this module goes and sdpa is
emitted from it like any composite op."""

from __future__ import annotations

import math

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType
from cuvil_ir.mlir.linalg import LinalgEmitter
from cuvil_ir.mlir.module import H, Unsupported, node_attr


class AttentionEmitter(LinalgEmitter):
    """sdpa."""

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
        p = self.emit_op("softmax", [s], st, dim=st.rank - 1, dtype=None)  # from its decomposition
        return self.named_matmul(p, v, out) or self.contract(p, v, out)


__all__ = ["AttentionEmitter"]
