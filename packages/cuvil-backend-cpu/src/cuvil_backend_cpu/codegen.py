"""Loop IR -> C: one translation unit per kernel, OpenMP threads and SIMD loops.

``par`` loops become ``#pragma omp parallel for`` (with an ``if`` on the work so
small shapes stay on one thread), ``vec`` loops ``#pragma omp simd`` (reduction
clauses for accumulators), ``parvec`` both. Size symbols are ``int64_t``
arguments, so one binary serves every shape. Index expressions print as integer
arithmetic; a size expression that is not a polynomial (``floor``, ``Max``,
``Piecewise`` of sizes) becomes a *derived* argument the wrapper evaluates once
per size binding. Math functions come from ``<math.h>``; with glibc's libmvec
(``simd_math``) the float ones are declared ``simd`` so vector loops call their
vector variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import sympy

from cuvil_backend_cpu.c_functions import C_STORAGE, C_TYPES, CodegenError, c_call
from cuvil_backend_cpu.half import HALF, HELPERS
from cuvil_backend_cpu.loop_ir.nodes import Accumulate, Let, Loop, LoopFunc, Prefetch, Scratch, Stmt, Store
from cuvil_ir.graph_ir.types import DType, stored_float
from cuvil_ir.size_visitor import Quotient
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.index_text import IndexPrinter

PRELUDE = """\
#include <math.h>
#include <stdint.h>
/* Integer division as Python/torch define it. A zero divisor sets *err (the kernel
   then returns nonzero and the caller raises ZeroDivisionError) instead of SIGFPE;
   INT64_MIN / -1 wraps as torch's does instead of trapping. */
static inline int64_t cu_floordiv(int64_t a, int64_t b, int* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return (int64_t)(0 - (uint64_t)a);
  int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t cu_mod(int64_t a, int64_t b, int* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t cu_fmod(int64_t a, int64_t b, int* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  return a % b;
}
/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"):
   a uniform float in [0, 1) for element `counter` of the stream `seed`. Counter
   based, so the numbers do not depend on threads, vector width or loop order. */
static inline float cu_rand(int64_t seed, int64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)((uint64_t)counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
  for (int i = 0; i < 10; ++i) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}
/* float erf as a rational function (coefficients and accuracy: erf_fit.py): a
   dozen FMAs and a divide that vectorise in place, 2.5x faster than a call. The FMAs
   are written out: kernels build with -std=c11, which keeps a * b + c two roundings
   (as eager's elementwise ops round), so Horner steps would be twice the operations
   (GELU over 2^18 floats, AVX-512, one thread: 0.14 ms, 0.10 with fmaf). Without
   hardware FMA, fmaf is a library call that stops vectorization: there a * b + c. */
#ifdef __FP_FAST_FMAF
#define CU_FMAF(a, b, c) fmaf(a, b, c)
#else
#define CU_FMAF(a, b, c) ((a) * (b) + (c))
#endif
static inline float cu_erff(float x) {
  const float a = x > 3.92f ? 3.92f : (x < -3.92f ? -3.92f : x);
  const float t = a * a;
  float p = -1.2658604831017328e-08f;
  p = CU_FMAF(p, t, 4.5838205551262945e-06f);
  p = CU_FMAF(p, t, 0.00037578423507511616f);
  p = CU_FMAF(p, t, 0.0038333649281412363f);
  p = CU_FMAF(p, t, 0.054214395582675934f);
  p = CU_FMAF(p, t, 0.1850714385509491f);
  p = CU_FMAF(p, t, 1.128379225730896f);
  float q = 6.21620929450728e-05f;
  q = CU_FMAF(q, t, 0.0012991661205887794f);
  q = CU_FMAF(q, t, 0.01541600190103054f);
  q = CU_FMAF(q, t, 0.11382868140935898f);
  q = CU_FMAF(q, t, 0.49734869599342346f);
  q = CU_FMAF(q, t, 1.0f);
  const float r = a * p / q;
  return r > 1.0f ? 1.0f : (r < -1.0f ? -1.0f : r);
}
/* index arithmetic (operands are sizes and indices: no zero divisors) */
static inline int64_t cu_ifloordiv(int64_t a, int64_t b) {  /* b > 0 */
  int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t cu_imod(int64_t a, int64_t b) {
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline float cu_remf(float a, float b) {
  float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double cu_rem(double a, double b) {
  double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
"""

#: the most bytes of a row a Prefetch statement touches (see loop_ir.statements.prefetches)
PREFETCH_BYTES = 8192
#: elements of a Scratch row kept on the stack (16 KiB of floats per thread); longer rows
#: are allocated per row, a cost that many elements of work hide
SCRATCH_STACK = 4096
_OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "|", "all": "&"}


@dataclass
class CKernel:
    """A generated kernel: its C source, and how the wrapper must call it."""

    name: str
    source: str
    #: derived arguments (size expressions the wrapper evaluates per binding), after the sizes:
    #: (expression, C type: "int64_t", or "double" for a float-valued one such as ``x_2**-0.5``)
    derived: list[tuple[sympy.Expr, str]] = field(default_factory=list)
    #: the kernel's signature (buffers, sizes, scalar arguments) as a Loop IR function
    #: without its body: what a launch needs. The body's text is ``loop_ir``; the body
    #: itself is not kept, so a program cache entry (or an artifact) decodes no loop
    #: nest's index expressions on a warm start (the bulk of its sympy)
    func: LoopFunc | None = None
    #: returns nonzero when an integer division met a zero divisor
    may_fail: bool = False
    #: the Loop IR text of the whole function (``cu.audit``'s ``loop_ir`` stage)
    loop_ir: str = ""


class _Gen(IndexPrinter):
    language = "C"
    error = CodegenError

    def __init__(self, func: LoopFunc, simd_math: bool, parallel_threshold: int) -> None:
        self.func = func
        self.simd_math = simd_math
        self.threshold = parallel_threshold
        self.derived: dict[tuple[sympy.Expr, str], str] = {}
        self.lines: list[str] = []
        self.local_types: dict[str, DType] = {}
        self.nan_flags: set[str] = set()
        #: the kernel uses a checked integer division (returns nonzero on a zero divisor)
        self.may_fail = False
        #: native lowerings the kernel calls: helper name -> its definition
        self.natives: dict[str, str] = {}
        #: the kernel converts a half type: it includes half.HELPERS (set by what emits one)
        self.half = False
        #: Scratch arrays in scope: name -> element dtype
        self.scratch: dict[str, DType] = {}
        self.needs_stdlib = False

    # -- index arithmetic (IndexPrinter's hooks) -------------------------------------
    def index(self, value: object) -> str:
        return self.print_index(value)

    def on_integer(self, value: int) -> str:
        return f"INT64_C({value})" if abs(value) >= 2**31 else str(value)

    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
        return s.name[1:] if E.is_loop_symbol(s) else f"s_{s.name}"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"(({a}) {'<' if is_min else '>'} ({b}) ? ({a}) : ({b}))"

    def on_mod(self, a: str, b: str, q: Quotient) -> str:
        return f"cu_imod({a}, {b})"

    def on_floordiv(self, a: str, b: str, q: Quotient) -> str:
        return f"cu_ifloordiv({a}, {b})"

    def on_and(self, a: str, b: str) -> str:
        return f"({a} && {b})"

    def on_or(self, a: str, b: str) -> str:
        return f"({a} || {b})"

    def on_not(self, a: str) -> str:
        return f"(!{a})"

    def on_select(self, cond: str, then: str, other: str) -> str:
        return f"({cond} ? {then} : {other})"

    def derived_size(self, e: sympy.Expr) -> str:
        return self.derived_arg(e, "int64_t")

    def derived_arg(self, e: sympy.Expr, ctype: str) -> str:
        """A size expression without a C form (or float-valued): the wrapper computes it."""
        key = (e, ctype)
        if key not in self.derived:
            self.derived[key] = f"d{len(self.derived)}"
        return self.derived[key]

    # -- scalar expressions ----------------------------------------------------------
    def const(self, c: E.Const) -> str:
        v, d = c.value, c.dtype
        if d.is_floating:
            f = stored_float(float(v), d) if d in HALF else float(v)
            if math.isnan(f):
                return "NAN"
            if math.isinf(f):
                return "INFINITY" if f > 0 else "(-INFINITY)"
            text = repr(f)
            return f"{text}f" if C_TYPES[d] == "float" else text
        if d == DType.bool:
            return "1" if v else "0"
        iv = int(v)
        if d == DType.i64:
            if iv == -(2**63):
                return "INT64_MIN"
            return f"INT64_C({iv})"
        return f"(({C_TYPES[d]}){iv})"

    def expr(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            return self.const(e)
        if isinstance(e, E.Var):
            return e.name
        if isinstance(e, E.Arg):
            return f"a_{e.name}"
        if isinstance(e, E.Load):
            if e.dtype in HALF:
                self.half = True
                return f"cu_ld_{e.dtype.value}(p_{e.buf}[{self.index(e.offset)}])"
            return f"p_{e.buf}[{self.index(e.offset)}]"
        if isinstance(e, E.Index):
            x = sympy.sympify(e.expr)
            if (
                e.dtype.is_floating
                and not x.is_integer
                and not any(E.is_loop_symbol(s) for s in x.free_symbols)
            ):
                text = f"(({C_TYPES[e.dtype]}){self.derived_arg(x, 'double')})"
            else:
                text = f"(({C_TYPES[e.dtype]}){self.index(x)})"
            if e.dtype in HALF:
                self.half = True
                return f"cu_round_{e.dtype.value}({text})"
            return text
        if isinstance(e, E.Reduce):
            raise CodegenError("a Reduce survived scheduling")
        return self.call(e)

    def call(self, e: E.Call) -> str:
        a = [self.expr(x) for x in e.args]
        fn, d = e.fn, e.dtype
        native = E.native_parts(fn)
        if native is not None:  # a custom op's C lowering (see [Note: native calls])
            name, params, body = native
            helper, ctype = f"cu_native_{name}", C_TYPES[d]
            if helper not in self.natives:  # the user's text, compiled alone once per process
                from cuvil_backend_cpu.native_check import check_native

                check_native(name, ctype, params, body, PRELUDE)
            args = ", ".join(f"{ctype} {p}" for p in params) or "void"
            self.natives.setdefault(helper, f"static inline {ctype} {helper}({args}) {{ return ({body}); }}")
            return f"{helper}({', '.join(a)})"
        src = e.args[0].dtype if e.args else d
        return c_call(self, fn, a, d, src)

    # -- statements ------------------------------------------------------------------
    def emit(self, s: Stmt, ind: str) -> None:
        if isinstance(s, Scratch):
            # a row on the stack up to SCRATCH_STACK elements (per thread: each iteration of a
            # parallel loop declares its own), on the heap beyond
            ctype, n, p = C_TYPES[s.dtype], self.index(s.extent), f"p_{s.name}"
            self.lines.append(f"{ind}{ctype} {s.name}_stack[{SCRATCH_STACK}];")
            self.lines.append(
                f"{ind}{ctype}* restrict {p} = ({n}) <= {SCRATCH_STACK} ? {s.name}_stack"
                f" : ({ctype}*)malloc(sizeof({ctype}) * (size_t)({n}));"
            )
            self.scratch[s.name] = s.dtype
            for b in s.body:
                self.emit(b, ind)
            del self.scratch[s.name]
            self.lines.append(f"{ind}if ({p} != {s.name}_stack) free({p});")
            self.needs_stdlib = True
        elif isinstance(s, Loop):
            v = s.var.name[1:]
            clauses = ""
            # a float max/min also collects "saw a NaN" (OpenMP's max/min combiners drop NaN)
            nans = [n for n, k in s.reduces if k in ("max", "min") and self.local_types[n].is_floating]
            new_nans = [n for n in nans if n not in self.nan_flags]
            for n in new_nans:
                # an integer as wide as the float's lane: the flag's vector is the compare's
                # mask itself (a uint8_t flag makes every vector iteration pack the mask, which
                # doubles the cost of a row's max pass)
                flag = "int32_t" if C_TYPES[self.local_types[n]] == "float" else "int64_t"
                self.lines.append(f"{ind}{flag} {n}_nan = 0;")
                self.nan_flags.add(n)
            if s.reduces:
                clauses = " " + " ".join(f"reduction({_OMP_REDUCTION[k]}:{n})" for n, k in s.reduces)
                clauses += "".join(f" reduction(|:{n}_nan)" for n in nans)
            cond = ""
            if s.work is not None:
                cond = f" if({self.index(s.work)} >= {self.threshold})"
            if s.kind == "par":
                self.lines.append(f"{ind}#pragma omp parallel for schedule(static){cond}{clauses}")
            elif s.kind == "parvec":
                self.lines.append(f"{ind}#pragma omp parallel for simd schedule(static){cond}{clauses}")
            elif s.kind == "vec":
                self.lines.append(f"{ind}#pragma omp simd{clauses}")
            start = self.index(s.start)
            self.lines.append(f"{ind}for (int64_t {v} = {start}; {v} < {self.index(s.extent)}; ++{v}) {{")
            for b in s.body:
                self.emit(b, ind + "  ")
            self.lines.append(f"{ind}}}")
            for n in new_nans:
                self.lines.append(f"{ind}if ({n}_nan) {n} = NAN;")
        elif isinstance(s, Let):
            self.local_types[s.name] = s.dtype
            const = "" if s.mutable else "const "
            self.lines.append(f"{ind}{const}{C_TYPES[s.dtype]} {s.name} = {self.expr(s.expr)};")
        elif isinstance(s, Accumulate):
            x = self.expr(s.expr)
            n = s.name
            if s.kind in ("sum", "prod") and self.local_types[n] in HALF:
                # every half reduction accumulates in float32 ([Note: opmath]); rounding the
                # accumulator at each step would not be eager's result
                raise CodegenError(f"a {s.kind} accumulated in {self.local_types[n].value}")
            if s.kind == "sum":
                self.lines.append(f"{ind}{n} += {x};")
            elif s.kind == "prod":
                self.lines.append(f"{ind}{n} *= {x};")
            elif s.kind in ("max", "min"):
                cmp = ">" if s.kind == "max" else "<"
                ty = C_TYPES[self.local_types[n]]
                nan = f" {n}_nan |= (v_ != v_);" if self.local_types[n].is_floating else ""
                self.lines.append(f"{ind}{{ const {ty} v_ = {x}; {n} = v_ {cmp} {n} ? v_ : {n};{nan} }}")
            elif s.kind == "any":
                self.lines.append(f"{ind}{n} |= (({x}) != 0);")
            elif s.kind == "all":
                self.lines.append(f"{ind}{n} &= (({x}) != 0);")
            else:
                raise CodegenError(f"reduction {s.kind}")
        elif isinstance(s, Prefetch):
            # one prefetch per 64-byte line, at most PREFETCH_BYTES of the run (a longer row
            # streams through the hardware prefetcher; what matters is its first lines)
            dtype = next(p.dtype for p in self.func.buffers if p.name == s.buf)
            size = dtype.torch.itemsize
            v = s.var.name[1:]
            nbytes = f"({self.index(s.extent)}) * {size}"
            self.lines.append(f"{ind}if ({v} + 1 < {self.index(s.limit)}) {{")
            self.lines.append(f"{ind}  const char* pf_ = (const char*)&p_{s.buf}[{self.index(s.offset)}];")
            self.lines.append(
                f"{ind}  const int64_t pf_n = {nbytes} < {PREFETCH_BYTES} ? {nbytes} : {PREFETCH_BYTES};"
            )
            self.lines.append(
                f"{ind}  for (int64_t pf_b = 0; pf_b < pf_n; pf_b += 64) __builtin_prefetch(pf_ + pf_b, 0, 3);"
            )
            self.lines.append(f"{ind}}}")
        else:
            assert isinstance(s, Store)
            self.lines.append(f"{ind}p_{s.buf}[{self.index(s.offset)}] = {self.store_value(s)};")

    def store_value(self, s: Store) -> str:
        if s.buf in self.scratch:
            return self.expr(s.expr)
        dtype = next(p.dtype for p in self.func.buffers if p.name == s.buf)
        if dtype not in HALF:
            return self.expr(s.expr)
        x = s.expr
        if isinstance(x, E.Call) and x.fn == "cast" and x.args[0].dtype == DType.f32:
            x = x.args[0]  # the store rounds: no cu_round_* before it
        self.half = True
        return f"cu_st_{dtype.value}({self.expr(x)})"

    def generate(self, restrict: bool) -> CKernel:
        body_lines: list[str] = []
        self.lines = body_lines
        for s in self.func.body:
            self.emit(s, "  ")
        q = " restrict" if restrict else ""
        params = []
        for p in self.func.buffers:
            const = "const " if p.role == "in" else ""
            params.append(f"{const}{C_STORAGE[p.dtype]}*{q} p_{p.name}")
        params += [f"int64_t s_{s.name}" for s in self.func.sizes]
        derived = list(self.derived)
        params += [f"{key[1]} {self.derived[key]}" for key in derived]
        params += [f"{C_TYPES[d]} a_{n}" for n, d in self.func.args]
        head = [PRELUDE]
        if self.needs_stdlib:
            head.append("#include <stdlib.h>")
        if self.half:
            head.append(HELPERS)
        if self.simd_math:
            from cuvil_backend_cpu.toolchain import SIMD_MATH_DECLARATIONS

            head.append(SIMD_MATH_DECLARATIONS)
        head.extend(self.natives.values())
        loop_ir = self.func.text
        head.append(f"/* Loop IR:\n{_comment(loop_ir)}\n*/")
        if self.may_fail:
            head.append(f"int {self.func.name}({', '.join(params) or 'void'}) {{")
            head.append("  int cu_err = 0;")
            body_lines.append("  return cu_err;")
        else:
            head.append(f"void {self.func.name}({', '.join(params) or 'void'}) {{")
        source = "\n".join(head + body_lines + ["}", ""])
        signature = replace(self.func, body=())
        return CKernel(self.func.name, source, derived, signature, self.may_fail, loop_ir)


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def generate_c(
    func: LoopFunc, *, simd_math: bool = True, parallel_threshold: int = 32768, restrict: bool = True
) -> CKernel:
    """C source for one Loop IR function (exported under the function's name)."""
    return _Gen(func, simd_math, parallel_threshold).generate(restrict)
