"""Rendering Tensor IR as Triton text: values and index arithmetic into scopes of lines,
reductions' combine and final steps, the store, and the module text of a kernel
(:class:`Renderer`). Where the lines go (tiles, loops, variants) is the schedule's
job (:mod:`cuvil_ir.triton_source.schedule`); this module decides only how a value reads.

Sizes are kernel arguments (``s_<symbol>``) and size expressions without a
polynomial form are *derived* arguments the wrapper evaluates once per size
binding (``d<k>``; ``d0`` is the number of elements or rows, ``d1`` a row's
longest extent); only block sizes are ``tl.constexpr``, so one kernel serves every
size. The output is deterministic: the same kernel gives the same text.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.size_visitor import Quotient
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.index_text import IndexPrinter
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.functions import HALF, SIGNATURE_TYPES, STORAGE_TYPES, TL_DTYPES, call, const
from cuvil_ir.triton_source.kernel import TritonCodegenError, TritonKernel, TritonRules
from cuvil_ir.triton_source.tiles import live_tiles

_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def identity(kind: str, dtype: DType) -> bool | int | float:
    if kind in _IDENTITY:
        v = _IDENTITY[kind]
        return float(v) if dtype.is_floating else v
    if dtype.is_floating:
        return -math.inf if kind == "max" else math.inf
    if dtype == DType.bool:
        return kind == "min"
    import torch

    info = torch.iinfo(dtype.torch)
    return info.min if kind == "max" else info.max


def literal(v: bool | int | float) -> str:
    """A Python literal Triton's ``tl.full`` accepts."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(v)


@dataclass
class Ctx:
    """Where lane-dependent values of one reduction (or of the store) are computed."""

    #: index into ``Renderer.scopes``
    scope: int
    #: key of the lane symbols' definitions (shared by ranges of equal extents)
    key: int
    #: loop symbol -> variable
    names: dict[sympy.Symbol, str]
    lane_mask: str
    mask: str
    #: the loop symbols the lanes stand for
    syms: list[sympy.Symbol] = field(default_factory=list)


@dataclass
class Scope:
    """Lines at one indentation (the kernel's body, or one reduction loop's) and the
    values already computed there."""

    lines: list[str] = field(default_factory=list)
    indent: str = "    "
    memo: dict[Any, str] = field(default_factory=dict)


class Renderer(IndexPrinter):
    """A kernel's values, index arithmetic and stores as lines in its scopes, and the
    module text around them (:meth:`finish`); what it has seen (buffers, sizes, derived
    arguments, scalar arguments, natives) becomes the kernel's signature."""

    language = "Triton"
    error = TritonCodegenError

    def __init__(self, kernel: Kernel, program: TensorProgram, rules: TritonRules) -> None:
        self.kernel = kernel
        self.program = program
        self.rules = rules
        #: variables holding a whole tile (see :mod:`cuvil_ir.triton_source.tiles`)
        self.tile_vars: set[str] = set()
        self.xnumel = "d0"
        #: native lowerings the kernel calls: helper name -> its ``@triton.jit`` definition
        self.natives: dict[str, str] = {}
        self.buffers: list[str] = [kernel.buf]
        self.sizes: set[sympy.Symbol] = set()
        self.derived: dict[tuple[sympy.Expr, str], str] = {}
        self.args: dict[str, DType] = {}
        self.may_fail = False
        self.count = 0
        self.scopes: list[Scope] = []
        self.row_syms: set[sympy.Symbol] = set()
        self.shape = "[XBLOCK]"
        self.row_names: dict[sympy.Symbol, str] = {}
        self.head_lines: list[str] = []
        self.loop_header = ""
        self.contexts: dict[tuple[Any, ...], Ctx] = {}

    # -- names ---------------------------------------------------------------------
    def tmp(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def derived_arg(self, e: sympy.Expr, kind: str) -> str:
        key = (e, kind)
        if key not in self.derived:
            self.derived[key] = f"d{len(self.derived)}"
        return self.derived[key]

    def line(self, scope: int, text: str) -> None:
        s = self.scopes[scope]
        s.lines.append(s.indent + text)

    # -- index arithmetic ----------------------------------------------------------
    def index(self, value: object, ctx: Ctx | None) -> str:
        return self.print_index(value, ctx)

    def on_symbol(self, s: sympy.Symbol, ctx: Any) -> str:
        if E.is_loop_symbol(s):
            if s in self.row_names:
                return self.row_names[s]
            if ctx is None or s not in ctx.names:
                raise TritonCodegenError(f"index {s} outside its range")
            return str(ctx.names[s])
        self.sizes.add(s)
        return f"s_{s.name}"

    def minmax(self, is_min: bool, a: str, b: str) -> str:
        return f"{'tl.minimum' if is_min else 'tl.maximum'}({a}, {b})"

    def on_mod(self, a: str, b: str, q: Quotient) -> str:
        return f"cu.mod({a}, {b})"

    def on_floordiv(self, a: str, b: str, q: Quotient) -> str:
        return f"cu.floordiv({a}, {b})"

    def visit_divisor(self, den: sympy.Expr, ctx: Any) -> str:
        return self.tensor_index(den, ctx)

    def on_and(self, a: str, b: str) -> str:
        return f"({a} & {b})"

    def on_or(self, a: str, b: str) -> str:
        return f"({a} | {b})"

    def on_not(self, a: str) -> str:
        return f"(~{a})"

    def on_select(self, cond: str, then: str, other: str) -> str:
        return f"tl.where({cond}, {then}, {other})"

    def derived_size(self, e: sympy.Expr) -> str:
        return self.derived_arg(e, "int")

    def tensor_index(self, value: object, ctx: Ctx | None) -> str:
        """An index as a tensor even when it is a literal or a size (``cu`` helpers read its dtype)."""
        e = sympy.sympify(value)
        text = self.index(e, ctx)
        if any(E.is_loop_symbol(s) for s in e.free_symbols):
            return text
        return f"tl.full([], {text}, tl.int64)"

    # -- values --------------------------------------------------------------------
    def lane_dependent(self, e: E.Expr) -> bool:
        return any(s not in self.row_syms for s in E.free_indices(e))

    def value(self, e: E.Expr, ctx: Ctx | None) -> str:
        """The variable (or literal text) holding ``e``, emitted once per scope."""
        lane = ctx is not None and self.lane_dependent(e)
        if isinstance(e, E.Reduce):
            lane = False
        key = (e, ctx.key if lane and ctx is not None else -1)
        scope = ctx.scope if lane and ctx is not None else 0
        for s in (0, scope) if scope else (0,):
            hit = self.scopes[s].memo.get(key)
            if hit is not None:
                return hit
        if isinstance(e, E.Const):
            return const(e.value, e.dtype)
        if isinstance(e, E.Arg):
            self.args[e.name] = e.dtype
            var = self.tmp("a")  # a tensor (the interpreter passes plain Python numbers)
            self.line(0, f"{var} = tl.full([], a_{e.name}, {TL_DTYPES[e.dtype]})")
            self.scopes[0].memo[key] = var
            return var
        if isinstance(e, E.Reduce):
            raise TritonCodegenError(f"reduction {E.expr_str(e)} used before it was computed")
        text = self.compute(e, ctx if lane else None)
        if text.isidentifier():  # a value that is another one (a half value widened): no copy
            self.scopes[scope].memo[key] = text
            return text
        var = self.tmp()
        self.line(scope, f"{var} = {text}")
        self.scopes[scope].memo[key] = var
        if lane or (self.shape == "[XBLOCK]" and E.free_indices(e)):
            self.tile_vars.add(var)
        return var

    def compute(self, e: E.Expr, ctx: Ctx | None) -> str:
        if isinstance(e, E.Load):
            if e.buf not in self.buffers:
                self.buffers.append(e.buf)
            off = self.index(e.offset, ctx)
            syms = E.free_indices(e)
            if not syms:
                load = f"tl.load(p_{e.buf} + {off})"
            else:
                lane = any(s not in self.row_syms for s in syms)
                row = any(s in self.row_syms for s in syms)
                assert not lane or ctx is not None
                mask = (ctx.mask if row else ctx.lane_mask) if lane and ctx is not None else "xmask"
                load = f"tl.load(p_{e.buf} + {off}, mask={mask}, other=0)"
            stored = self.program.buffers[e.buf].dtype
            if stored == DType.bf16:  # widened at once ([Note: half precision in Triton]): exact
                return f"cu.widen_bf16({load})"
            if stored == DType.f16:
                return f"{load}.to(tl.float32)"
            # a bool buffer holds bytes: Tritons before 3.4 (triton-ascend) load them as int8
            return f"({load} != 0)" if stored == DType.bool else load
        if isinstance(e, E.Index):
            x = sympy.sympify(e.expr)
            loop = any(E.is_loop_symbol(s) for s in x.free_symbols)
            if x.is_Integer:
                return const(int(x), e.dtype)
            if e.dtype.is_floating and not x.is_integer and not loop:
                wide = f"tl.full([], {self.derived_arg(x, 'float')}, tl.float32)"
                return call("cast", [wide], [DType.f32], e.dtype)
            text = self.index(x, ctx)
            if not loop:  # a size is a plain int (or a constexpr 1) until it meets a tensor
                text = f"tl.full([], {text}, tl.int64)"
            if e.dtype in HALF:  # rounded through float32, as torch converts an integer
                return call("cast", [text], [DType.i64], e.dtype)
            return f"{text}.to({TL_DTYPES[e.dtype]})"
        assert isinstance(e, E.Call)
        args = [self.value(a, ctx) for a in e.args]
        native = E.native_parts(e.fn)
        if native is not None:  # a custom op's Triton lowering (see [Note: native calls])
            name, params, body = native
            helper = f"native_{name}"
            self.natives.setdefault(
                helper, f"@triton.jit\ndef {helper}({', '.join(params)}):\n    return {body}\n\n"
            )
            return f"{helper}({', '.join(args)})"
        text = call(e.fn, args, [a.dtype for a in e.args], e.dtype)
        if e.fn in ("floordiv", "mod", "fmod") and not e.args[0].dtype.is_floating:
            divisor = e.args[1]
            if not (isinstance(divisor, E.Const) and divisor.value != 0):
                self.may_fail = True
                lane = ctx is not None and self.lane_dependent(e)
                mask = ctx.mask if lane and ctx is not None else "xmask"
                scope = ctx.scope if lane and ctx is not None else 0
                # (the divisor's test as a full tile: Triton's interpreter gives int64, which a
                # mask may not be, for a bool tile & a 0-d bool, the test of a size divisor)
                zeros = self.zeros(lane)
                self.line(scope, f"tl.store(p_err + {zeros}, 1, mask={mask} & ({args[1]} + {zeros} == 0))")
        return text

    def zeros(self, lane: bool) -> str:
        """An int64 zero tile of the scope's full shape (makes a pointer tile full size)."""
        if self.shape == "[XBLOCK]":
            return "tl.zeros([XBLOCK], tl.int64)"
        return "tl.zeros([XBLOCK, RBLOCK], tl.int64)" if lane else "tl.zeros([XBLOCK, 1], tl.int64)"

    def store(self, dtype: DType, offset: sympy.Expr, val: str, ctx: Ctx | None, vdtype: DType) -> None:
        lane = ctx is not None
        scope = ctx.scope if ctx is not None else 0
        s = self.scopes[scope]
        if vdtype != dtype:
            val = call("cast", [val], [vdtype], dtype)
        if dtype == DType.bf16:  # rounded already: the narrowing is exact
            val = f"cu.to_bf16({val})"
        elif dtype == DType.f16:
            val = f"{val}.to({STORAGE_TYPES[dtype]})"
        off = self.index(offset, ctx)
        mask = ctx.mask if ctx is not None else "xmask"
        ptr = f"p_{self.kernel.buf} + {off} + {self.zeros(lane)}"
        s.lines.append(f"{s.indent}tl.store({ptr}, {val}, mask={mask})")

    def finish(self, rows: bool, branches: list[list[str]] | None) -> TritonKernel:
        name = self.kernel.name
        prog = self.program
        sizes = tuple(sorted(self.sizes, key=lambda s: s.name))
        derived = [(e, "int" if kind.startswith("int") else kind) for e, kind in self.derived]
        args = tuple(sorted(self.args.items()))
        signature: list[tuple[str, str]] = [
            (f"p_{b}", "*" + SIGNATURE_TYPES[prog.buffers[b].dtype]) for b in self.buffers
        ]
        if self.may_fail:
            signature.append(("p_err", "*i32"))
        signature += [(f"s_{s.name}", "i64") for s in sizes]
        signature += [(self.derived[key], "fp32" if key[1] == "float" else "i64") for key in self.derived]
        signature += [(f"a_{n}", SIGNATURE_TYPES[d]) for n, d in args]
        consts = ["XBLOCK"] + (["RBLOCK", "ONE_TILE"] if rows else [])
        signature += [(c, "constexpr") for c in consts]
        params = []
        for p, t in signature:
            if p.startswith("a_"):
                params.append(f"{p}: {TL_DTYPES[dict(args)[p[2:]]]}")
            elif t == "constexpr":
                params.append(f"{p}: tl.constexpr")
            elif t == "fp32" and p.startswith("d"):
                params.append(f"{p}: tl.float32")
            else:
                params.append(p)
        lines = [
            "import triton",
            "import triton.language as tl",
            "",
            "",
            *(line for helper in self.natives.values() for line in helper.splitlines() + [""]),
            "@triton.jit",
            f"def {name}({', '.join(params)}):",
            f"    # {comment(str(self.kernel))}",
        ]
        body = list(self.head_lines)
        if branches is None:
            body += self.scopes[0].lines
        else:
            body.append("    if ONE_TILE:  # the row fits one tile: every input element is loaded once")
            body += branches[0]
            body.append("    else:  # rows longer than a tile: each reduction loops over the row")
            body += branches[1]
        lines += self.persistent(body) if self.rules.persistent else body
        source = "\n".join(lines) + "\n"
        return TritonKernel(
            name=name,
            source=source,
            buffers=tuple(self.buffers),
            sizes=sizes,
            derived=tuple(derived),
            args=args,
            rows=rows,
            may_fail=self.may_fail,
            signature=tuple(signature),
            tiles=live_tiles(source, name, self.tile_vars),
            element_bytes=max(4, *(prog.buffers[b].dtype.torch.itemsize for b in self.buffers)),
            narrow_bytes=min(prog.buffers[b].dtype.torch.itemsize for b in self.buffers),
        )

    def persistent(self, body: list[str]) -> list[str]:
        """``body`` inside a loop over the blocks this program owns: blocks
        ``program_id, + num_programs, ...`` (every block when the grid is smaller)."""
        first, rest = body[0], body[1:]
        start = "    x = tl.program_id(0).to(tl.int64) * XBLOCK"
        assert first.startswith(start), first
        loop = (
            f"    for xblock in range(tl.program_id(0), tl.cdiv({self.xnumel}, XBLOCK), tl.num_programs(0)):"
        )
        first = "    x = tl.full([], xblock, tl.int64) * XBLOCK" + first[len(start) :]
        return [loop, "    " + first, *("    " + line for line in rest)]


def combine(kind: str, dtype: DType, acc: str, v: str) -> str:
    if kind == "sum":
        return f"{acc} + {v}"
    if kind == "prod":
        return f"{acc} * {v}"
    if kind in ("max", "min"):
        if dtype.is_floating:  # NaN sticks, as in torch
            cmp = ">" if kind == "max" else "<"
            return f"tl.where(({v} {cmp} {acc}) | ({v} != {v}), {v}, {acc})"
        return f"{'tl.maximum' if kind == 'max' else 'tl.minimum'}({acc}, {v})"
    if kind == "any":
        return f"{acc} | ({v} != 0)"
    if kind == "all":
        return f"{acc} & ({v} != 0)"
    raise TritonCodegenError(f"reduction {kind}")


def final(kind: str, dtype: DType, tile: str, res: str) -> Iterator[str]:
    """Lines reducing ``tile`` along its lanes into ``res`` (a ``[XBLOCK, 1]`` column)."""
    tl_t = TL_DTYPES[dtype]
    if kind == "sum":
        yield f"{res} = tl.sum({tile}, 1).to({tl_t})[:, None]"
    elif kind == "prod":
        yield f"{res} = tl.reduce({tile}, 1, cu.prod_combine).to({tl_t})[:, None]"
    elif kind in ("max", "min"):
        fn = "tl.max" if kind == "max" else "tl.min"
        yield f"{res} = {fn}({tile}, 1)[:, None]"
        if dtype.is_floating:
            nan = f"tl.max(({tile} != {tile}).to(tl.int8), 1)[:, None] > 0"
            yield f'{res} = tl.where({nan}, float("nan"), {res}).to({tl_t})'
    elif kind == "any":
        yield f"{res} = tl.max(({tile} != 0).to(tl.int8), 1)[:, None] > 0"
    elif kind == "all":
        yield f"{res} = tl.min(({tile} != 0).to(tl.int8), 1)[:, None] > 0"
    else:
        raise TritonCodegenError(f"reduction {kind}")


def comment(text: str) -> str:
    return " ".join(text.split())[:400]


__all__ = ["Ctx", "Renderer", "Scope", "combine", "comment", "final", "identity", "literal"]
