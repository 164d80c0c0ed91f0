"""The MLIR emitter's machinery: types, constants, size expressions, scalar and tensor
building blocks. The per-op emission, control flow and the module live in
:mod:`cuvil_ir.mlir.emit`."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from cuvil_ir.graph_ir.nodes import KV, Graph, Node, Ref
from cuvil_ir.graph_ir.types import (
    SCALAR_DTYPES,
    DType,
    ScalarKind,
    ScalarType,
    TensorType,
    Type,
    element_dtype,
    promote_types,
)
from cuvil_ir.symbolic import Dim, dim_str, expr_str


class MlirError(Exception):
    """A graph (or one of its nodes) that cannot be emitted as MLIR."""


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
_BITS = {DType.u8: 8, DType.i8: 8, DType.i16: 16, DType.i32: 32, DType.i64: 64, DType.f16: 16}
_BITS.update({DType.bf16: 16, DType.f32: 32, DType.f64: 64})

# An operand: (SSA name, Graph IR type)
H = tuple[str, Type]


def elem(d: DType) -> str:
    if d not in _ELEM:
        raise MlirError(f"dtype {d.value} has no MLIR element type here")
    return _ELEM[d]


dtype_of = element_dtype


def mlir_type(t: Type) -> str:
    if isinstance(t, ScalarType):
        return elem(SCALAR_DTYPES[t.kind])
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


class EmitterBase:
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


class _Unsupported(Exception):
    """Raised inside an op emitter: the node becomes an external call instead."""


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
