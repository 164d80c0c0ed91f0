"""Reductions: ``linalg.fill`` of the identity and a ``linalg.generic`` with
``"reduction"`` iterators (sum, prod, amax/amin, all/any, mean), and the two-result
generics of argmax/argmin and ``max``/``min`` with a dim."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import DType, TensorType
from cuvil_ir.mlir.elementwise import ElementwiseEmitter
from cuvil_ir.mlir.module import BITS, H, Unsupported, node_attr

#: reduction op -> combiner kind of its linalg.generic
_REDUCTIONS = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "all": "all", "any": "any"}


class ReductionEmitter(ElementwiseEmitter):
    """Reductions and arg-reductions."""

    def reduce(
        self, x: H, dims: Sequence[int], keepdim: bool, kind: str, out_dtype: DType | None = None
    ) -> H:
        v, t = x
        assert isinstance(t, TensorType)
        rank = t.rank
        dims = sorted({d % rank for d in dims}) if rank else []
        od = out_dtype or t.dtype
        shape = [1 if i in dims else s for i, s in enumerate(t.shape) if keepdim or i not in dims]
        out = TensorType(od, tuple(shape), t.device)
        init: float | int | bool
        if kind == "sum":
            init = 0
        elif kind == "prod":
            init = 1
        elif kind in ("max", "min"):
            if od.is_floating:
                init = -math.inf if kind == "max" else math.inf
            elif od == DType.bool:
                init = kind == "min"
            else:
                b = BITS[od] - 1
                init = -(2**b) if kind == "max" else 2**b - 1
        elif kind == "all":
            init = True
        else:
            init = False
        acc = self.filled(out, init)
        omap = ", ".join("0" if i in dims else f"d{i}" for i in range(rank) if keepdim or i not in dims)
        ident = ", ".join(f"d{i}" for i in range(rank))
        its = ["reduction" if i in dims else "parallel" for i in range(rank)]

        def body(a: list[str], o: list[str]) -> list[str]:
            y = self.cvt(a[0], t.dtype, od)
            f = od.is_floating
            if kind == "sum":
                return [self.add(o[0], y, od)]
            if kind == "prod":
                return [self.mul(o[0], y, od)]
            if kind == "max":
                return [self.op2("arith.maximumf" if f else "arith.maxsi", o[0], y, od)]
            if kind == "min":
                return [self.op2("arith.minimumf" if f else "arith.minsi", o[0], y, od)]
            return [self.op2("arith.andi" if kind == "all" else "arith.ori", o[0], y, od)]

        return self.generic([(acc, out, omap)], [(v, t, ident)], rank, its, body)[0], out

    def numel(self, t: TensorType, dims: Sequence[int]) -> sympy.Basic:
        n: Any = sympy.Integer(1)
        for d in dims:
            n = n * t.shape[d % t.rank]
        return sympy.sympify(n)

    def mean(self, x: H, dims: Sequence[int], keepdim: bool, od: DType) -> H:
        """``mean``, a primitive (the registry declares no decomposition for it): the sum,
        accumulated in f32 for half types, over the element count from the sizes."""
        t = x[1]
        assert isinstance(t, TensorType)
        cd = DType.f32 if od in (DType.f16, DType.bf16) else od
        s = self.reduce(x, dims, keepdim, "sum", cd)
        n = self.fconst(self.numel(t, dims), cd)
        assert isinstance(s[1], TensorType)
        return self.ew(s[1].replace(dtype=od), [s, n], "div")

    def _dims_attr(self, node: Node, name: str = "dims") -> list[int]:
        t = node.inputs[0].type
        assert isinstance(t, TensorType)
        dims = node_attr(node, name)
        if dims is None:
            return list(range(t.rank))
        if isinstance(dims, int):
            return [dims % max(t.rank, 1)]
        return [int(d) % max(t.rank, 1) for d in dims]

    def _reduction(self, node: Node, kind: str) -> H:
        x = self.ins(node)[0]
        out = node.output.type
        assert isinstance(out, TensorType)
        r = self.reduce(x, self._dims_attr(node), bool(node_attr(node, "keepdim")), kind, out.dtype)
        return r

    def op_reduction(self, node: Node) -> H:
        """sum, prod, amax, amin, all, any: one ``linalg.generic`` reduction each."""
        return self._reduction(node, _REDUCTIONS[node.op])

    def op_mean(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x = self.ins(node)[0]
        return self.mean(x, self._dims_attr(node), bool(node_attr(node, "keepdim")), out.dtype)

    def _arg(self, node: Node, kind: str, with_values: bool) -> list[H]:
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dim = node_attr(node, "dim")
        if dim is None:
            raise Unsupported(f"{node.op} without dim")
        dim = int(dim) % t.rank
        keep = bool(node_attr(node, "keepdim"))
        vout = node.outputs[0].type if with_values else node.output.type.replace(dtype=t.dtype)  # type: ignore[union-attr]
        iout = node.outputs[-1].type
        assert isinstance(vout, TensorType) and isinstance(iout, TensorType)
        init = -math.inf if kind == "max" else math.inf
        if not t.dtype.is_floating:
            init = -(2**63) if kind == "max" else 2**63 - 1
            if t.dtype != DType.i64:
                raise Unsupported(f"{node.op} on {t.dtype.value}")
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


__all__ = ["ReductionEmitter"]
