"""Elementwise ops: conversions between element types, the scalar math of each
primitive elementwise op (the body of a ``linalg.generic``, or a scalar op), and the
broadcasting generic around it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir import scalar_functions
from cuvil_ir.graph_ir.decompose import NotDecomposed
from cuvil_ir.graph_ir.nodes import Node
from cuvil_ir.graph_ir.registry import REGISTRY, registrar
from cuvil_ir.graph_ir.scalar_decompositions import op_computing
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
        # a primitive (no decomposition) with no upstream ``math`` op: 1 / (1 + exp(-x))
        one = self.const(1.0, d)
        e = self.op1("math.exp", self.op1("arith.negf", x, d), d)
        return self.op2("arith.divf", one, self.op2("arith.addf", one, e, d), d)

    def scalar(self, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]) -> str:
        """One element of an elementwise op (the body of a generic, or a scalar op): its
        rule in :data:`TYPED` or :data:`ARITH`."""
        typed = TYPED.get(op)
        if typed is not None:
            return typed(self, op, args, out, attrs)
        rule = ARITH.get(op)
        if rule is None:
            raise self.error(f"elementwise op {op} is not emitted")
        # arithmetic: compute in the output dtype (f32 for half types; true division of
        # integers in f32)
        cd = DType.f32 if out in (DType.f16, DType.bf16) else out
        if op == "div" and not cd.is_floating:
            cd = DType.f32
        xs = [self.cvt(v, s, cd) for v, s in args]
        if op in FLOAT_ONLY and not cd.is_floating:
            if op not in INTEGER_IDENTITY:
                raise self.error(f"{op} on {cd.value} is not emitted")
            r = xs[0]  # floor, ceil, trunc and round of an integer
        else:
            r = rule(self, op, xs, cd, attrs)
        return self.cvt(r, cd, out)

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


# -- the scalar rules: one entry per primitive elementwise op --------------------------------------
# [Note: MLIR elementwise rules] The ops MLIR emits through :meth:`ElementwiseEmitter.scalar`
# are the registry's elementwise primitives (the ``elementwise`` trait, no decomposition);
# an op with a decomposition is emitted from it (``op_decomposed``), so no rule here
# repeats a decomposition's math. A primitive whose scalar function has no ``math`` op
# here but a decomposition in the table of scalar functions is emitted from that
# (:func:`from_decomposition`). ``test_mlir.py`` checks both directions.

#: ``rule(emitter, op, args, out, attrs)``: an op whose operands keep their own dtypes
#: (``args`` are (SSA value, dtype) pairs; the result is of dtype ``out``)
TypedRule = Callable[[ElementwiseEmitter, str, list[tuple[str, DType]], DType, dict[str, Any]], str]
#: ``rule(emitter, op, xs, d, attrs)``: an arithmetic op, its operands ``xs`` converted to
#: the compute dtype ``d`` (the result's, f32 for half types)
ArithRule = Callable[[ElementwiseEmitter, str, list[str], DType, dict[str, Any]], str]

TYPED: dict[str, TypedRule] = {}
ARITH: dict[str, ArithRule] = {}
#: of the float-only ops (:data:`FLOAT_ONLY`), those that are the identity on integers
INTEGER_IDENTITY = frozenset({"floor", "ceil", "trunc", "round"})

typed = registrar(TYPED)
arith = registrar(ARITH)


@typed("cast")
def _cast(
    em: ElementwiseEmitter, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]
) -> str:
    return em.cvt(args[0][0], args[0][1], out)


@typed("eq", "ne", "lt", "le", "gt", "ge")
def _compare(
    em: ElementwiseEmitter, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]
) -> str:
    cd = promote_types(*(TensorType(d, ()) for _, d in args))
    a, b = (em.cvt(v, s, cd) for v, s in args)
    return em.cmp(op, a, b, cd)


_LOGICAL = {"logical_and": "arith.andi", "logical_or": "arith.ori", "logical_xor": "arith.xori"}


@typed("logical_and", "logical_or", "logical_xor", "logical_not")
def _logical(
    em: ElementwiseEmitter, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]
) -> str:
    vs = [em.cvt(v, s, DType.bool) for v, s in args]
    t = em.const(True, DType.bool)
    if op == "logical_not":
        r = em.op2("arith.xori", vs[0], t, DType.bool)
    else:
        r = em.op2(_LOGICAL[op], vs[0], vs[1], DType.bool)
    return em.cvt(r, DType.bool, out)


@typed("where")
def _where(
    em: ElementwiseEmitter, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]
) -> str:
    c = em.cvt(args[0][0], args[0][1], DType.bool)
    a, b = (em.cvt(v, s, out) for v, s in args[1:])
    return em.select(c, a, b, out)


@arith("add", "sub", "mul", "div")
def _basic(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return {"add": em.add, "sub": em.sub, "mul": em.mul, "div": em.div}[op](xs[0], xs[1], d)


#: op -> (float op, integer op)
_BINARY = {
    "maximum": ("arith.maximumf", "arith.maxsi"),
    "minimum": ("arith.minimumf", "arith.minsi"),
    "bitwise_and": ("arith.andi", "arith.andi"),
    "bitwise_or": ("arith.ori", "arith.ori"),
    "bitwise_xor": ("arith.xori", "arith.xori"),
    "pow": ("math.powf", "math.ipowi"),
    "fmod": ("arith.remf", "arith.remsi"),
}


@arith(*_BINARY)
def _binary(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    f, i = _BINARY[op]
    return em.op2(f if d.is_floating else i, xs[0], xs[1], d)


@arith("bitwise_not")
def _bitwise_not(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op2("arith.xori", xs[0], em.const(True if d == DType.bool else -1, d), d)


@arith("neg")
def _neg(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op1("arith.negf", xs[0], d) if d.is_floating else em.sub(em.const(0, d), xs[0], d)


@arith("abs")
def _abs(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op1("math.absf" if d.is_floating else "math.absi", xs[0], d)


@arith("relu")
def _relu(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op2("arith.maximumf" if d.is_floating else "arith.maxsi", xs[0], em.const(0, d), d)


@arith("square")
def _square(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.mul(xs[0], xs[0], d)


@arith("floor_divide")
def _floor_divide(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    if d.is_floating:
        return em.op1("math.floor", em.div(xs[0], xs[1], d), d)
    return em.op2("arith.floordivsi", xs[0], xs[1], d)


@arith("remainder")
def _remainder(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    """Python's ``%``: the sign of the divisor."""
    a, b = xs
    if d.is_floating:
        q = em.op1("math.floor", em.div(a, b, d), d)
        return em.sub(a, em.mul(q, b, d), d)
    r = em.op2("arith.remsi", a, b, d)
    zero = em.const(0, d)
    nz = em.cmp("ne", r, zero, d)
    diff = em.cmp("lt", em.op2("arith.xori", r, b, d), zero, d)
    fix = em.op2("arith.andi", nz, diff, DType.bool)
    return em.select(fix, em.add(r, b, d), r, d)


@arith("clamp")
def _clamp(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    x, f = xs[0], d.is_floating
    lo, hi = attrs.get("min"), attrs.get("max")
    if lo is not None:
        x = em.op2("arith.maximumf" if f else "arith.maxsi", x, em.const(lo, d), d)
    if hi is not None:
        x = em.op2("arith.minimumf" if f else "arith.minsi", x, em.const(hi, d), d)
    return x


@arith("sign")
def _sign(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    x = xs[0]
    zero, one = em.const(0, d), em.const(1, d)
    pos = em.cmp("gt", x, zero, d)
    neg = em.cmp("lt", x, zero, d)
    m1 = em.const(-1, d)
    return em.select(pos, one, em.select(neg, m1, zero, d), d)


#: float-only ops that are one upstream ``math`` op
_MATH = {
    "exp": "math.exp", "log": "math.log", "tanh": "math.tanh", "sqrt": "math.sqrt",
    "rsqrt": "math.rsqrt", "sin": "math.sin", "cos": "math.cos", "tan": "math.tan",
    "atan": "math.atan", "asinh": "math.asinh", "erf": "math.erf", "log1p": "math.log1p", "log2": "math.log2",
    "expm1": "math.expm1", "floor": "math.floor", "ceil": "math.ceil", "trunc": "math.trunc",
}  # fmt: skip


@arith(*_MATH)
def _math(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op1(_MATH[op], xs[0], d)


@arith("atan2")
def _atan2(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.op2("math.atan2", xs[0], xs[1], d)


@arith("round")
def _round(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    x = xs[0]
    dec = attrs.get("decimals") or 0
    if dec:
        s = em.const(10.0**dec, d)
        return em.div(em.op1("math.roundeven", em.mul(x, s, d), d), s, d)
    return em.op1("math.roundeven", x, d)


@arith("reciprocal")
def _reciprocal(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.div(em.const(1.0, d), xs[0], d)


@arith("sigmoid")
def _sigmoid(em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]) -> str:
    return em.sigmoid(xs[0], d)


def from_decomposition(
    em: ElementwiseEmitter, op: str, xs: list[str], d: DType, attrs: dict[str, Any]
) -> str:
    """An op whose scalar function has no ``math`` form here: that function's decomposition
    ([Note: scalar decompositions]), each function it calls emitted by the rule of the
    primitive computing it, in the compute dtype ``d``."""
    fn = REGISTRY.get(op).scalar
    if fn is None or not scalar_functions.decomposed(fn):
        raise em.error(f"elementwise op {op} is not emitted")

    def call(name: str, operands: list[str]) -> str:
        try:
            prim = op_computing(name)
        except NotDecomposed as e:
            raise em.error(str(e)) from None
        return em.scalar(prim, [(v, d) for v in operands], d, {})

    return scalar_functions.expand(fn, xs, call, lambda value: em.const(value, d))


#: the primitives with neither rule whose scalar function has a decomposition
_DECOMPOSED = frozenset(
    n
    for n in REGISTRY.names()
    if n not in TYPED
    and n not in ARITH
    and "elementwise" in REGISTRY.get(n).traits
    and REGISTRY.get(n).decompose is None
    and scalar_functions.decomposed(REGISTRY.get(n).scalar or "")
)
ARITH.update(dict.fromkeys(_DECOMPOSED, from_decomposition))

#: ops with no integer form (of an integer, an error unless in :data:`INTEGER_IDENTITY`)
FLOAT_ONLY = frozenset(
    {
        *_MATH,
        "atan2",
        "round",
        "reciprocal",
        "sigmoid",
        *(n for n in _DECOMPOSED if scalar_functions.TABLE[REGISTRY.get(n).scalar or ""].float_only),
    }
)


def elementwise_primitives() -> frozenset[str]:
    """The registry's elementwise ops without a decomposition: those MLIR emits natively,
    each by its rule in :data:`TYPED` or :data:`ARITH`."""
    return frozenset(
        n
        for n in REGISTRY.names()
        if "elementwise" in REGISTRY.get(n).traits and REGISTRY.get(n).decompose is None
    )


__all__ = [
    "ARITH",
    "FLOAT_ONLY",
    "INTEGER_IDENTITY",
    "TYPED",
    "ArithRule",
    "from_decomposition",
    "ElementwiseEmitter",
    "TypedRule",
    "elementwise_primitives",
]
