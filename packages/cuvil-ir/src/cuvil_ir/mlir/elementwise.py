"""Elementwise ops: conversions between element types, the scalar math of each
primitive elementwise op (the body of a ``linalg.generic``, or a scalar op), and the
broadcasting generic around it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.types import SCALAR_DTYPES, DType, ScalarKind, ScalarType, TensorType, promote_types
from cuvil_ir.mlir.module import BITS, H, dtype_of, elem
from cuvil_ir.mlir.tensors import TensorBuilder


class ElementwiseEmitter(TensorBuilder):
    """Conversions, scalar math and elementwise generics."""

    def index_of(self, v: str, d: DType) -> str:
        if d == DType.bool:
            v = self.cvt(v, d, DType.i64)
            d = DType.i64
        r = self.fresh()
        op = "index_castui" if d == DType.u8 else "index_cast"
        self.emit(f"{r} = arith.{op} {v} : {elem(d)} to index")
        return r

    # -- conversions and scalar ops -----------------------------------------------------
    def cvt(self, v: str, s: DType, d: DType) -> str:
        if s == d or elem(s) == elem(d) and s != DType.u8 and d != DType.u8:
            return v
        if d in (DType.f16, DType.bf16) and s not in (DType.f32, DType.bool):
            # torch builds c10::Half / c10::BFloat16 from a float: f64 and integers round to f32
            # first, then to the half type (double rounding, as eager). The lowering then meets
            # only f32 -> f16/bf16 truncations (bf16 ones are expanded to integer ops: run.py).
            return self.cvt(self.cvt(v, s, DType.f32), DType.f32, d)
        r = self.fresh()
        es, ed = elem(s), elem(d)
        if s == DType.bool:
            if d.is_floating:
                self.emit(f"{r} = arith.uitofp {v} : i1 to {ed}")
            else:
                self.emit(f"{r} = arith.extui {v} : i1 to {ed}")
        elif d == DType.bool:
            if s.is_floating:
                self.emit(f"{r} = arith.cmpf une, {v}, {self.const(0.0, s)} : {es}")
            else:
                self.emit(f"{r} = arith.cmpi ne, {v}, {self.const(0, s)} : {es}")
        elif s.is_integer and d.is_integer:
            if es == ed:
                return v
            if BITS[s] < BITS[d]:
                op = "extui" if s == DType.u8 else "extsi"
                self.emit(f"{r} = arith.{op} {v} : {es} to {ed}")
            else:
                self.emit(f"{r} = arith.trunci {v} : {es} to {ed}")
        elif s.is_integer and d.is_floating:
            op = "uitofp" if s == DType.u8 else "sitofp"
            self.emit(f"{r} = arith.{op} {v} : {es} to {ed}")
        elif s.is_floating and d.is_integer:
            op = "fptoui" if d == DType.u8 else "fptosi"
            self.emit(f"{r} = arith.{op} {v} : {es} to {ed}")
        elif s.is_floating and d.is_floating:
            op = "extf" if BITS[s] < BITS[d] else "truncf"
            self.emit(f"{r} = arith.{op} {v} : {es} to {ed}")
        else:
            raise self.error(f"no conversion from {s.value} to {d.value}")
        return r

    def op1(self, op: str, a: str, d: DType) -> str:
        r = self.fresh()
        self.emit(f"{r} = {op} {a} : {elem(d)}")
        return r

    def op2(self, op: str, a: str, b: str, d: DType) -> str:
        r = self.fresh()
        self.emit(f"{r} = {op} {a}, {b} : {elem(d)}")
        return r

    def select(self, c: str, a: str, b: str, d: DType) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.select {c}, {a}, {b} : {elem(d)}")
        return r

    def cmp(self, pred: str, a: str, b: str, d: DType) -> str:
        r = self.fresh()
        if d.is_floating:
            fp = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}[pred]
            self.emit(f"{r} = arith.cmpf {fp}, {a}, {b} : {elem(d)}")
        else:
            sign = "u" if d in (DType.u8, DType.bool) else "s"
            ip = {"eq": "eq", "ne": "ne"}.get(pred, sign + pred)
            self.emit(f"{r} = arith.cmpi {ip}, {a}, {b} : {elem(d)}")
        return r

    def add(self, a: str, b: str, d: DType) -> str:
        return self.op2("arith.addf" if d.is_floating else "arith.addi", a, b, d)

    def mul(self, a: str, b: str, d: DType) -> str:
        return self.op2("arith.mulf" if d.is_floating else "arith.muli", a, b, d)

    def sub(self, a: str, b: str, d: DType) -> str:
        return self.op2("arith.subf" if d.is_floating else "arith.subi", a, b, d)

    def div(self, a: str, b: str, d: DType) -> str:
        return self.op2("arith.divf" if d.is_floating else "arith.divsi", a, b, d)

    def sigmoid(self, x: str, d: DType) -> str:
        one = self.const(1.0, d)
        e = self.op1("math.exp", self.op1("arith.negf", x, d), d)
        return self.op2("arith.divf", one, self.op2("arith.addf", one, e, d), d)

    def scalar(self, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]) -> str:
        """One element of an elementwise op (the body of a generic, or a scalar op)."""
        comparisons = {"eq", "ne", "lt", "le", "gt", "ge"}
        if op == "cast":
            return self.cvt(args[0][0], args[0][1], out)
        if op in comparisons:
            cd = promote_types(*(TensorType(d, ()) for _, d in args))
            a, b = (self.cvt(v, s, cd) for v, s in args)
            return self.cmp(op, a, b, cd)
        if op.startswith("logical_"):
            vs = [self.cvt(v, s, DType.bool) for v, s in args]
            t = self.const(True, DType.bool)
            if op == "logical_not":
                r = self.op2("arith.xori", vs[0], t, DType.bool)
            else:
                r = self.op2(
                    {"logical_and": "arith.andi", "logical_or": "arith.ori"}.get(op, "arith.xori"),
                    vs[0],
                    vs[1],
                    DType.bool,
                )
            return self.cvt(r, DType.bool, out)
        if op == "where":
            c = self.cvt(args[0][0], args[0][1], DType.bool)
            a, b = (self.cvt(v, s, out) for v, s in args[1:])
            return self.select(c, a, b, out)
        # arithmetic: compute in the output dtype (f32 for half types)
        cd = DType.f32 if out in (DType.f16, DType.bf16) else out
        if op == "div" and not cd.is_floating:
            cd = DType.f32
        xs = [self.cvt(v, s, cd) for v, s in args]
        r = self._arith(op, xs, cd, attrs)
        return self.cvt(r, cd, out)

    def _arith(self, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
        f = d.is_floating
        x = xs[0]
        if op in ("add", "sub", "mul", "div"):
            return {"add": self.add, "sub": self.sub, "mul": self.mul, "div": self.div}[op](xs[0], xs[1], d)
        if op in ("maximum", "minimum"):
            name = (
                ("arith.maximumf" if f else "arith.maxsi")
                if op == "maximum"
                else ("arith.minimumf" if f else "arith.minsi")
            )
            return self.op2(name, xs[0], xs[1], d)
        if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            return self.op2(
                {"bitwise_and": "arith.andi", "bitwise_or": "arith.ori"}.get(op, "arith.xori"),
                xs[0],
                xs[1],
                d,
            )
        if op == "bitwise_not":
            return self.op2("arith.xori", x, self.const(True if d == DType.bool else -1, d), d)
        if op == "neg":
            return self.op1("arith.negf", x, d) if f else self.sub(self.const(0, d), x, d)
        if op == "abs":
            return self.op1("math.absf" if f else "math.absi", x, d)
        if op == "relu":
            return self.op2("arith.maximumf" if f else "arith.maxsi", x, self.const(0, d), d)
        if op == "square":
            return self.mul(x, x, d)
        if op == "pow":
            if f:
                return self.op2("math.powf", xs[0], xs[1], d)
            return self.op2("math.ipowi", xs[0], xs[1], d)
        if op == "floor_divide":
            if f:
                return self.op1("math.floor", self.div(xs[0], xs[1], d), d)
            return self.op2("arith.floordivsi", xs[0], xs[1], d)
        if op == "fmod":
            return self.op2("arith.remf" if f else "arith.remsi", xs[0], xs[1], d)
        if op == "remainder":
            a, b = xs
            if f:
                q = self.op1("math.floor", self.div(a, b, d), d)
                return self.sub(a, self.mul(q, b, d), d)
            r = self.op2("arith.remsi", a, b, d)
            zero = self.const(0, d)
            nz = self.cmp("ne", r, zero, d)
            diff = self.cmp("lt", self.op2("arith.xori", r, b, d), zero, d)
            fix = self.op2("arith.andi", nz, diff, DType.bool)
            return self.select(fix, self.add(r, b, d), r, d)
        if op == "clamp":
            lo, hi = attrs.get("min"), attrs.get("max")
            if lo is not None:
                x = self.op2("arith.maximumf" if f else "arith.maxsi", x, self.const(lo, d), d)
            if hi is not None:
                x = self.op2("arith.minimumf" if f else "arith.minsi", x, self.const(hi, d), d)
            return x
        if op == "sign":
            zero, one = self.const(0, d), self.const(1, d)
            pos = self.cmp("gt", x, zero, d)
            neg = self.cmp("lt", x, zero, d)
            m1 = self.const(-1, d)
            return self.select(pos, one, self.select(neg, m1, zero, d), d)
        if not f:
            if op in ("floor", "ceil", "trunc", "round"):
                return x
            raise self.error(f"{op} on {d.value} is not emitted")
        unary = {
            "exp": "math.exp", "log": "math.log", "tanh": "math.tanh", "sqrt": "math.sqrt",
            "rsqrt": "math.rsqrt", "sin": "math.sin", "cos": "math.cos", "tan": "math.tan",
            "atan": "math.atan", "erf": "math.erf", "log1p": "math.log1p", "log2": "math.log2",
            "expm1": "math.expm1", "floor": "math.floor", "ceil": "math.ceil", "trunc": "math.trunc",
        }  # fmt: skip
        if op in unary:
            return self.op1(unary[op], x, d)
        if op == "atan2":
            return self.op2("math.atan2", xs[0], xs[1], d)
        if op == "round":
            dec = attrs.get("decimals") or 0
            if dec:
                s = self.const(10.0**dec, d)
                return self.div(self.op1("math.roundeven", self.mul(x, s, d), d), s, d)
            return self.op1("math.roundeven", x, d)
        if op == "reciprocal":
            return self.div(self.const(1.0, d), x, d)
        if op == "sigmoid":
            return self.sigmoid(x, d)
        raise self.error(f"elementwise op {op} is not emitted")

    def elementwise(
        self, out: TensorType, operands: Sequence[H], fn: Callable[[list[tuple[str, DType]]], str]
    ) -> str:
        ins = [(v, t, self.bmap(t, out)) for v, t in operands if isinstance(t, TensorType)]
        e = self.empty(out)

        def body(a: list[str], _o: list[str]) -> list[str]:
            it = iter(a)
            vals = [
                (next(it), t.dtype) if isinstance(t, TensorType) else (v, dtype_of(t)) for v, t in operands
            ]
            return [fn(vals)]

        ident = ", ".join(f"d{i}" for i in range(out.rank))
        return self.generic([(e, out, ident)], ins, out.rank, ["parallel"] * out.rank, body)[0]

    def ew(self, out: TensorType, operands: Sequence[H], op: str, **attrs: Any) -> H:
        return self.elementwise(out, operands, lambda vs: self.scalar(op, vs, out.dtype, attrs)), out

    def fconst(self, value: float | sympy.Basic, d: DType) -> H:
        """A float scalar operand (``f64``) from a number or a size expression."""
        if isinstance(value, sympy.Basic) and not value.is_Number:
            return self.flt(value), ScalarType(ScalarKind.float)
        return self.const(float(value), DType.f64), ScalarType(ScalarKind.float)

    def op_elementwise(self, node: Node) -> H:
        out = node.output.type
        attrs = dict(node.attrs)
        operands = self.ins(node)
        if isinstance(out, ScalarType):
            d = SCALAR_DTYPES[out.kind]
            return self.scalar(node.op, [(v, dtype_of(t)) for v, t in operands], d, attrs), out
        return self.ew(out, operands, node.op, **attrs)


__all__ = ["ElementwiseEmitter"]
