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
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, Block, Graph, Node, Ref, Value
from cuvil_ir.graph_ir.types import DType, ScalarKind, ScalarType, TensorType, Type
from cuvil_ir.symbolic import Dim, dim_str, expr_str, symbol

#: reduction op -> combiner kind of its linalg.generic
_REDUCTIONS = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "all": "all", "any": "any"}


class MlirError(Exception):
    """A graph (or one of its nodes) that cannot be emitted as MLIR."""


@dataclass
class MlirResult:
    text: str
    externs: list[str]
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def lowerable(self) -> bool:
        return not self.externs


_ELEM = {
    DType.bool: "i1",
    DType.u8: "i8",
    DType.i8: "i8",
    DType.i16: "i16",
    DType.i32: "i32",
    DType.i64: "i64",
    DType.f16: "f16",
    DType.bf16: "bf16",
    DType.f32: "f32",
    DType.f64: "f64",
}
_SCALAR_DTYPE = {ScalarKind.bool: DType.bool, ScalarKind.int: DType.i64, ScalarKind.float: DType.f64}
_BITS = {DType.u8: 8, DType.i8: 8, DType.i16: 16, DType.i32: 32, DType.i64: 64, DType.f16: 16}
_BITS.update({DType.bf16: 16, DType.f32: 32, DType.f64: 64})

# An operand: (SSA name, Graph IR type)
H = tuple[str, Type]


def elem(d: DType) -> str:
    if d not in _ELEM:
        raise MlirError(f"dtype {d.value} has no MLIR element type here")
    return _ELEM[d]


def dtype_of(t: Type) -> DType:
    return t.dtype if isinstance(t, TensorType) else _SCALAR_DTYPE[t.kind]


def mlir_type(t: Type) -> str:
    if isinstance(t, ScalarType):
        return elem(_SCALAR_DTYPE[t.kind])
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in t.shape)
    return f"tensor<{dims}{elem(t.dtype)}>"


def _is_float(d: DType) -> bool:
    return d.is_floating


def _is_int(d: DType) -> bool:
    return d.is_integer


def float_lit(v: float, d: DType) -> str:
    if math.isfinite(v):
        return f"{v:.17e}"
    if d == DType.f64:
        return "0x" + struct.pack(">d", v).hex().upper()
    if d == DType.f32:
        return "0x" + struct.pack(">f", v).hex().upper()
    if d == DType.f16:
        return "0x" + struct.pack(">e", v).hex().upper()
    if d == DType.bf16:
        return "0x" + struct.pack(">f", v).hex().upper()[:4]
    raise MlirError(f"no float literal for {d}")


def promote(types: Sequence[Type]) -> DType:
    """torch-style result dtype of an op on these operands (scalars are weak)."""
    cat = {DType.bool: 0}

    def category(d: DType) -> int:
        return 0 if d == DType.bool else (1 if d.is_integer else 2)

    tensors = [t.dtype for t in types if isinstance(t, TensorType)]
    scalars = [_SCALAR_DTYPE[t.kind] for t in types if isinstance(t, ScalarType)]
    del cat
    best: DType | None = None
    for d in tensors:
        if best is None or category(d) > category(best):
            best = d
        elif category(d) == category(best) and d != best:
            if category(d) == 2:
                wide = {DType.f16: 1, DType.bf16: 1, DType.f32: 2, DType.f64: 3}
                if wide[d] == wide[best]:
                    best = DType.f32
                elif wide[d] > wide[best]:
                    best = d
            elif category(d) == 1:
                if {d, best} == {DType.u8, DType.i8}:
                    best = DType.i16
                elif _BITS[d] > _BITS[best]:
                    best = d
    for s in scalars:
        if best is None:
            best = s
        elif category(s) > category(best):
            best = DType.f32 if category(s) == 2 else DType.i64
    assert best is not None
    return best


class _Emitter:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.counter = 0
        self.lines: list[str] = []
        self.indent = 2
        self.scopes: list[dict[object, str]] = [{}]
        self.values: dict[str, H] = {}
        self.externs: dict[str, str] = {}
        self.extern_decls: dict[tuple[str, str, str], str] = {}
        self.extern_count: dict[str, int] = {}
        self.node: Node | None = None
        # sizes the graph assumes equal to a constant (``assume Eq(y_0, 1)``): broadcasting facts
        self.known: dict[sympy.Basic, sympy.Basic] = {}
        for a in graph.assumptions:
            if isinstance(a, sympy.Eq):
                for x, y in ((a.lhs, a.rhs), (a.rhs, a.lhs)):
                    if isinstance(x, sympy.Symbol) and y.is_Integer:
                        self.known[x] = y

    def is_one(self, d: Dim) -> bool:
        return d == 1 or (not isinstance(d, int) and sympy.sympify(d).xreplace(self.known) == 1)

    # -- plumbing ---------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append(" " * self.indent + line)

    def lookup(self, key: object) -> str | None:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def remember(self, key: Any, ssa: str) -> str:
        self.scopes[-1][key] = ssa
        return ssa

    def push(self) -> None:
        self.scopes.append({})
        self.indent += 2

    def pop(self) -> None:
        self.scopes.pop()
        self.indent -= 2

    def error(self, msg: str) -> MlirError:
        n = self.node
        where = f"{n.op}" + (f" at {n.loc}" if n is not None and n.loc is not None else "") if n else "graph"
        return MlirError(f"{self.graph.name}: {where}: {msg}")

    # -- constants ----------------------------------------------------------------------
    def const(self, value: float | int | bool, d: DType) -> str:
        key = ("const", d, repr(value), type(value))
        got = self.lookup(key)
        if got is not None:
            return got
        r = self.fresh("c")
        if d == DType.bool:
            self.emit(f"{r} = arith.constant {'true' if value else 'false'}")
        elif d.is_floating:
            self.emit(f"{r} = arith.constant {float_lit(float(value), d)} : {elem(d)}")
        else:
            self.emit(f"{r} = arith.constant {int(value)} : {elem(d)}")
        return self.remember(key, r)

    def cindex(self, v: int) -> str:
        key = ("index", v)
        got = self.lookup(key)
        if got is not None:
            return got
        r = self.fresh("c")
        self.emit(f"{r} = arith.constant {v} : index")
        return self.remember(key, r)

    # -- size expressions ---------------------------------------------------------------
    def idx(self, e: Dim | sympy.Basic) -> str:
        """An ``index`` value for an integer size expression."""
        if isinstance(e, (int, sympy.Integer)):
            return self.cindex(int(e))
        e = sympy.sympify(e)
        key = ("idx", e)
        got = self.lookup(key)
        if got is not None:
            return got
        r = self._idx(e)
        return self.remember(key, r)

    def _bin(self, op: str, a: str, b: str, ty: str = "index") -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.{op} {a}, {b} : {ty}")
        return r

    def _idx(self, e: sympy.Basic) -> str:
        if isinstance(e, sympy.Symbol):
            got = self.lookup(("sym", e))
            if got is None:
                raise self.error(f"size symbol {e} is not bound by any input")
            return got
        if isinstance(e, sympy.Piecewise):
            args = list(e.args)
            *rest, (last, _) = args
            acc = self.idx(last)
            for val, cond in reversed(rest):
                c = self.cond(cond)
                r = self.fresh()
                self.emit(f"{r} = arith.select {c}, {self.idx(val)}, {acc} : index")
                acc = r
            return acc
        if isinstance(e, sympy.floor) or isinstance(e, sympy.ceiling):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self.idx(num)
            op = "floordivsi" if isinstance(e, sympy.floor) else "ceildivsi"
            return self._bin(op, self.idx(num), self.idx(den))
        if isinstance(e, sympy.Mod):
            return self._bin("remsi", self.idx(e.args[0]), self.idx(e.args[1]))
        if isinstance(e, (sympy.Max, sympy.Min)):
            op = "maxsi" if isinstance(e, sympy.Max) else "minsi"
            acc = self.idx(e.args[0])
            for a in e.args[1:]:
                acc = self._bin(op, acc, self.idx(a))
            return acc
        num, den = sympy.fraction(sympy.together(e))
        if den != 1:
            return self._bin("divsi", self.idx(num), self.idx(den))
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            acc = self.idx(terms[0])
            for t in terms[1:]:
                acc = self._bin("addi", acc, self.idx(t))
            return acc
        if isinstance(e, sympy.Mul):
            terms = sorted(e.args, key=sympy.default_sort_key)
            acc = self.idx(terms[0])
            for t in terms[1:]:
                acc = self._bin("muli", acc, self.idx(t))
            return acc
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            base = self.idx(e.base)
            acc = base
            for _ in range(int(e.exp) - 1):
                acc = self._bin("muli", acc, base)
            return acc
        raise self.error(f"cannot emit size expression {expr_str(e)}")

    def cond(self, e: sympy.Basic) -> str:
        """An ``i1`` value for a size predicate."""
        if e in (sympy.true, True):
            return self.const(True, DType.bool)
        if e in (sympy.false, False):
            return self.const(False, DType.bool)
        key = ("cond", e)
        got = self.lookup(key)
        if got is not None:
            return got
        preds = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.Lt: "slt", sympy.Le: "sle"}
        preds.update({sympy.Gt: "sgt", sympy.Ge: "sge"})
        r: str
        if type(e) in preds:
            r = self.fresh()
            a, b = self.idx(e.lhs), self.idx(e.rhs)
            self.emit(f"{r} = arith.cmpi {preds[type(e)]}, {a}, {b} : index")
        elif isinstance(e, (sympy.And, sympy.Or)):
            op = "andi" if isinstance(e, sympy.And) else "ori"
            r = self._fold(op, e.args, self.cond, "i1")
        elif isinstance(e, sympy.Not):
            r = self._bin("xori", self.cond(e.args[0]), self.const(True, DType.bool), "i1")
        else:
            raise self.error(f"cannot emit size predicate {expr_str(e)}")
        return self.remember(key, r)

    def _fold(self, op: str, args: Sequence[sympy.Basic], each: Callable[[sympy.Basic], str], ty: str) -> str:
        """``op`` over the values of ``args`` in canonical order, left to right."""
        ordered = sorted(args, key=sympy.default_sort_key)
        r = each(ordered[0])
        for a in ordered[1:]:
            r = self._bin(op, r, each(a), ty)
        return r

    def flt(self, e: sympy.Basic) -> str:
        """An ``f64`` value for a float-valued size expression (``x_2**(-0.5)``)."""
        e = sympy.sympify(e)
        if e.is_Number:
            return self.const(float(e), DType.f64)
        key = ("flt", e)
        got = self.lookup(key)
        if got is not None:
            return got
        r: str
        if e.is_integer:
            i = self.i64_of_index(self.idx(e))
            r = self.fresh()
            self.emit(f"{r} = arith.sitofp {i} : i64 to f64")
        elif isinstance(e, (sympy.Add, sympy.Mul)):
            op = "addf" if isinstance(e, sympy.Add) else "mulf"
            r = self._fold(op, e.args, self.flt, "f64")
        elif isinstance(e, sympy.Pow):
            r = self.fresh()
            self.emit(f"{r} = math.powf {self.flt(e.base)}, {self.flt(e.exp)} : f64")
        else:
            raise self.error(f"cannot emit float expression {expr_str(e)}")
        return self.remember(key, r)

    def i64_of_index(self, v: str) -> str:
        r = self.fresh()
        self.emit(f"{r} = arith.index_cast {v} : index to i64")
        return r

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
            if _BITS[s] < _BITS[d]:
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
            if {s, d} == {DType.f16, DType.bf16}:
                return self.cvt(self.cvt(v, s, DType.f32), DType.f32, d)
            op = "extf" if _BITS[s] < _BITS[d] else "truncf"
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

    def softplus(self, x: str, d: DType, beta: float = 1.0, threshold: float = 20.0) -> str:
        bx = self.mul(x, self.const(beta, d), d)
        sp = self.op1("math.log1p", self.op1("math.exp", bx, d), d)
        sp = self.div(sp, self.const(beta, d), d)
        big = self.cmp("gt", bx, self.const(threshold, d), d)
        return self.select(big, x, sp, d)

    def scalar(self, op: str, args: list[tuple[str, DType]], out: DType, attrs: dict[str, Any]) -> str:
        """One element of an elementwise op (the body of a generic, or a scalar op)."""
        comparisons = {"eq", "ne", "lt", "le", "gt", "ge"}
        if op == "cast":
            return self.cvt(args[0][0], args[0][1], out)
        if op in comparisons:
            cd = promote([TensorType(d, ()) for _, d in args])
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
        if op == "silu":
            return self.mul(x, self.sigmoid(x, d), d)
        if op == "gelu":
            half, one = self.const(0.5, d), self.const(1.0, d)
            if attrs.get("approximate") == "tanh":
                x3 = self.mul(self.mul(x, x, d), x, d)
                inner = self.add(x, self.mul(self.const(0.044715, d), x3, d), d)
                t = self.op1("math.tanh", self.mul(self.const(math.sqrt(2 / math.pi), d), inner, d), d)
            else:
                t = self.op1("math.erf", self.mul(x, self.const(1 / math.sqrt(2), d), d), d)
            return self.mul(self.mul(half, x, d), self.add(one, t, d), d)
        if op == "softplus":
            return self.softplus(x, d, float(attrs.get("beta") or 1.0), float(attrs.get("threshold") or 20.0))
        if op == "mish":
            return self.mul(x, self.op1("math.tanh", self.softplus(x, d), d), d)
        if op == "logsigmoid":
            mn = self.op2("arith.minimumf", x, self.const(0.0, d), d)
            ax = self.op1("math.absf", x, d)
            lp = self.op1("math.log1p", self.op1("math.exp", self.op1("arith.negf", ax, d), d), d)
            return self.sub(mn, lp, d)
        if op in ("hardsigmoid", "hardswish"):
            t = self.add(self.div(x, self.const(6.0, d), d), self.const(0.5, d), d)
            t = self.op2("arith.maximumf", t, self.const(0.0, d), d)
            t = self.op2("arith.minimumf", t, self.const(1.0, d), d)
            return t if op == "hardsigmoid" else self.mul(x, t, d)
        if op in ("leaky_relu", "elu"):
            pos = self.cmp("gt", x, self.const(0.0, d), d)
            if op == "leaky_relu":
                neg = self.mul(x, self.const(float(attrs.get("negative_slope") or 0.01), d), d)
            else:
                em1 = self.op1("math.expm1", x, d)
                neg = self.mul(em1, self.const(float(attrs.get("alpha") or 1.0), d), d)
            return self.select(pos, x, neg, d)
        raise self.error(f"elementwise op {op} is not emitted")

    # -- tensors ------------------------------------------------------------------------
    def dims_of(self, t: TensorType) -> list[str]:
        """SSA values of the dynamic dims of ``t`` (in order)."""
        return [self.idx(d) for d in t.shape if not isinstance(d, int)]

    def empty(self, t: TensorType) -> str:
        r = self.fresh("e")
        self.emit(f"{r} = tensor.empty({', '.join(self.dims_of(t))}) : {mlir_type(t)}")
        return r

    def filled(self, t: TensorType, value: float | int | bool) -> str:
        e = self.empty(t)
        c = self.const(value, t.dtype)
        r = self.fresh()
        self.emit(
            f"{r} = linalg.fill ins({c} : {elem(t.dtype)}) outs({e} : {mlir_type(t)}) -> {mlir_type(t)}"
        )
        return r

    def generic(
        self,
        outs: Sequence[tuple[str, TensorType, str]],
        ins: Sequence[tuple[str, TensorType, str]],
        rank: int,
        iterators: Sequence[str],
        body: Callable[[list[str], list[str]], list[str]],
    ) -> list[str]:
        """A linalg.generic; ``ins``/``outs`` are (ssa, type, map results); body gets block args."""
        dims = ", ".join(f"d{i}" for i in range(rank))
        maps = ", ".join(f"affine_map<({dims}) -> ({m})>" for _, _, m in [*ins, *outs])
        its = ", ".join(f'"{i}"' for i in iterators)
        results = [self.fresh() for _ in outs]
        head = f"{', '.join(results)} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}]}}"
        if ins:
            head += f" ins({', '.join(v for v, _, _ in ins)} : {', '.join(mlir_type(t) for _, t, _ in ins)})"
        head += (
            f" outs({', '.join(v for v, _, _ in outs)} : {', '.join(mlir_type(t) for _, t, _ in outs)}) {{"
        )
        self.emit(head)
        args = [self.fresh("a") for _ in (*ins, *outs)]
        types = [elem(t.dtype) for _, t, _ in (*ins, *outs)]
        self.emit("^bb0(" + ", ".join(f"{a}: {ty}" for a, ty in zip(args, types)) + "):")
        self.push()
        ys = body(args[: len(ins)], args[len(ins) :])
        self.emit(f"linalg.yield {', '.join(ys)} : {', '.join(elem(t.dtype) for _, t, _ in outs)}")
        self.pop()
        rt = ", ".join(mlir_type(t) for _, t, _ in outs)
        self.emit(f"}} -> ({rt})" if len(outs) > 1 else f"}} -> {rt}")
        return results

    def bmap(self, t: TensorType, out: TensorType) -> str:
        """Broadcasting map of operand ``t`` into loops over ``out``'s dims."""
        off = out.rank - t.rank
        res = []
        for i, d in enumerate(t.shape):
            o = out.shape[off + i]
            res.append("0" if self.is_one(d) and not self.is_one(o) else f"d{off + i}")
        return ", ".join(res)

    def index_in_body(self, i: int) -> str:
        r = self.fresh()
        self.emit(f"{r} = linalg.index {i} : index")
        return r

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
                b = _BITS[od] - 1
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

    def ew(self, out: TensorType, operands: Sequence[H], op: str, **attrs: Any) -> H:
        return self.elementwise(out, operands, lambda vs: self.scalar(op, vs, out.dtype, attrs)), out

    def fconst(self, value: float | sympy.Basic, d: DType) -> H:
        """A float scalar operand (``f64``) from a number or a size expression."""
        if isinstance(value, sympy.Basic) and not value.is_Number:
            return self.flt(value), ScalarType(ScalarKind.float)
        return self.const(float(value), DType.f64), ScalarType(ScalarKind.float)

    def mean(self, x: H, dims: Sequence[int], keepdim: bool, od: DType) -> H:
        t = x[1]
        assert isinstance(t, TensorType)
        cd = DType.f32 if od in (DType.f16, DType.bf16) else od
        s = self.reduce(x, dims, keepdim, "sum", cd)
        n = self.fconst(self.numel(t, dims), cd)
        assert isinstance(s[1], TensorType)
        return self.ew(s[1].replace(dtype=od), [s, n], "div")

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

    def cast_to(self, v: str, src: Type, dst: Type) -> str:
        if mlir_type(src) == mlir_type(dst):
            return v
        r = self.fresh()
        self.emit(f"{r} = tensor.cast {v} : {mlir_type(src)} to {mlir_type(dst)}")
        return r

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

    def run_nodes(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            self.node = node
            fn = getattr(self, "op_" + node.op, None)
            if fn is None and node.op in _ELEMENTWISE:
                fn = self.op_elementwise
            if fn is None and node.op in _REDUCTIONS:
                fn = self.op_reduction
            if fn is None:
                self.extern(node, "no upstream MLIR equivalent is emitted for this op")
                continue
            try:
                mark = (len(self.lines), self.counter)
                res = fn(node)
            except _Unsupported as e:
                del self.lines[mark[0] :]
                self.extern(node, str(e))
                continue
            if not isinstance(res, list):
                res = [res]
            for o, (v, t) in zip(node.outputs, res):
                self.values[o.name] = (self.cast_to(v, t, o.type), o.type)

    def ins(self, node: Node) -> list[H]:
        return [self.values[v.name] for v in node.inputs]

    def op_elementwise(self, node: Node) -> H:
        out = node.output.type
        attrs = dict(node.attrs)
        operands = self.ins(node)
        if isinstance(out, ScalarType):
            d = _SCALAR_DTYPE[out.kind]
            return self.scalar(node.op, [(v, dtype_of(t)) for v, t in operands], d, attrs), out
        return self.ew(out, operands, node.op, **attrs)

    def op_const(self, node: Node) -> H:
        out = node.output.type
        value = _attr(node, "value")
        if isinstance(out, TensorType):
            raise _Unsupported("tensor constants are not emitted")
        d = _SCALAR_DTYPE[out.kind]
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

    def _var(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dims = self._dims_attr(node)
        m = self.mean(x, dims, True, t.dtype)
        dev = self.ew(t, [x, m], "sub")
        sq = self.ew(t, [dev], "square")
        s = self.reduce(sq, dims, bool(_attr(node, "keepdim")), "sum")
        corr = _attr(node, "correction")
        n = self.numel(t, dims) - (corr if isinstance(corr, (int, float)) else 1)
        v = self.ew(out, [s, self.fconst(n, t.dtype)], "div")
        return self.ew(out, [v], "sqrt") if node.op == "std" else v

    op_var = _var
    op_std = _var

    def op_logsumexp(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x = self.ins(node)[0]
        t = x[1]
        assert isinstance(t, TensorType)
        dims = self._dims_attr(node)
        keep = bool(_attr(node, "keepdim"))
        m = self.reduce(x, dims, True, "max")
        e = self.ew(t, [self.ew(t, [x, m], "sub")], "exp")
        s = self.reduce(e, dims, keep, "sum")
        ls = self.ew(out, [s], "log")
        mm = self.reduce(m, dims, keep, "max") if not keep else m
        return self.ew(out, [ls, mm], "add")

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

    def op_softmax(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        return self.softmax(self.ins(node)[0], int(_attr(node, "dim")), node.op == "log_softmax", out.dtype)

    op_log_softmax = op_softmax

    def _normalize(self, x: H, dims: list[int], eps: float, out: TensorType, rms: bool) -> H:
        t = x[1]
        assert isinstance(t, TensorType)
        cd = DType.f32 if t.dtype in (DType.f16, DType.bf16) else t.dtype
        ct = t.replace(dtype=cd)
        if t.dtype != cd:
            x = self.ew(ct, [x], "cast")
        if rms:
            dev = x
        else:
            m = self.mean(x, dims, True, cd)
            dev = self.ew(ct, [x, m], "sub")
        v = self.mean(self.ew(ct, [dev], "square"), dims, True, cd)
        vt = v[1]
        assert isinstance(vt, TensorType)
        r = self.ew(vt, [self.ew(vt, [v, self.fconst(eps, cd)], "add")], "rsqrt")
        return self.ew(ct, [dev, r], "mul")

    def op_layer_norm(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x, *params = self.ins(node)
        ns = _attr(node, "normalized_shape")
        k = len(ns)
        t = x[1]
        assert isinstance(t, TensorType)
        dims = list(range(t.rank - k, t.rank))
        eps = _attr(node, "eps")
        rms = node.op == "rms_norm"
        if eps is None:
            eps = float(__import__("torch").finfo(out.dtype.torch).eps)
        y = self._normalize(x, dims, float(eps), out, rms)
        it = iter(params)
        yt = y[1]
        assert isinstance(yt, TensorType)
        if _attr(node, "has_weight"):
            y = self.ew(yt, [y, next(it)], "mul")
        if not rms and _attr(node, "has_bias"):
            y = self.ew(yt, [y, next(it)], "add")
        return self.ew(out, [y], "cast") if yt.dtype != out.dtype else y

    op_rms_norm = op_layer_norm

    def op_batch_norm(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x, mean, var, *params = self.ins(node)
        t = x[1]
        assert isinstance(t, TensorType)

        def chan(h: H) -> H:  # (C,) -> (C, 1, ..., 1)
            ht = h[1]
            assert isinstance(ht, TensorType)
            return self.reshape(h, TensorType(ht.dtype, (ht.shape[0],) + (1,) * (t.rank - 2), ht.device))

        mt = chan(mean)
        vt = chan(var)
        ct = vt[1]
        assert isinstance(ct, TensorType)
        r = self.ew(ct, [self.ew(ct, [vt, self.fconst(float(_attr(node, "eps")), ct.dtype)], "add")], "rsqrt")
        y = self.ew(out, [self.ew(out, [x, mt], "sub"), r], "mul")
        it = iter(params)
        if _attr(node, "has_weight"):
            y = self.ew(out, [y, chan(next(it))], "mul")
        if _attr(node, "has_bias"):
            y = self.ew(out, [y, chan(next(it))], "add")
        return y

    def op_group_norm(self, node: Node) -> H:
        out = node.output.type
        assert isinstance(out, TensorType)
        x, *params = self.ins(node)
        t = x[1]
        assert isinstance(t, TensorType)
        g = int(_attr(node, "num_groups"))
        n, c = t.shape[0], t.shape[1]
        rest: Any = sympy.Integer(1)
        for d in t.shape[2:]:
            rest = rest * d
        cg = sympy.floor(sympy.sympify(c) / g)
        gt = TensorType(t.dtype, (n, g, _dim(cg * rest)), t.device)
        xg = self.reshape(x, gt)
        y = self._normalize(xg, [2], float(_attr(node, "eps")), gt, False)
        y = self.reshape(y, out)
        it = iter(params)

        def chan(h: H) -> H:
            ht = h[1]
            assert isinstance(ht, TensorType)
            return self.reshape(h, TensorType(ht.dtype, (ht.shape[0],) + (1,) * (t.rank - 2), ht.device))

        if _attr(node, "has_weight"):
            y = self.ew(out, [y, chan(next(it))], "mul")
        if _attr(node, "has_bias"):
            y = self.ew(out, [y, chan(next(it))], "add")
        return y

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
            return self.cvt(s, _SCALAR_DTYPE[t.kind], DType.bool)
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


class _Unsupported(Exception):
    """Raised inside an op emitter: the node becomes an external call instead."""


_ELEMENTWISE = {
    "abs", "add", "atan", "atan2", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "cast",
    "ceil", "clamp", "cos", "div", "elu", "eq", "erf", "exp", "expm1", "floor", "floor_divide", "fmod",
    "ge", "gelu", "gt", "hardsigmoid", "hardswish", "le", "leaky_relu", "log", "log1p", "log2",
    "logical_and", "logical_not", "logical_or", "logical_xor", "logsigmoid", "lt", "maximum", "minimum",
    "mish", "mul", "ne", "neg", "pow", "reciprocal", "relu", "remainder", "round", "rsqrt", "sigmoid",
    "sign", "silu", "sin", "softplus", "sqrt", "square", "sub", "tan", "tanh", "trunc", "where",
}  # fmt: skip


def _attr(node: Node, name: str) -> Any:
    return node.attr(name)


def _dim(e: Any) -> Dim:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else e


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _attr_text(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_attr_text(x) for x in v) + "]"
    if isinstance(v, KV):
        return "{" + ", ".join(f"{k} = {_attr_text(x)}" for k, x in v.items) + "}"
    if isinstance(v, Ref):
        return f"${v.index}"
    if isinstance(v, DType):
        return v.value
    if isinstance(v, sympy.Basic):
        return f"<{dim_str(v) if not v.is_Relational else expr_str(v)}>"
    if v is None:
        return "none"
    return repr(v)


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
