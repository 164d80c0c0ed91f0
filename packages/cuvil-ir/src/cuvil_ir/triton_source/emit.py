"""Tensor IR kernel -> the text of one ``@triton.jit`` function (see docs/cuda-backend.md).

This module emits text and imports no ``triton``: the ``cuda`` and ``ascend``
targets share it and each brings its own Triton. The generated module uses two
names besides ``triton``: ``tl`` (``triton.language``) and ``cu``, the target's
device library (:mod:`cuvil_ir.triton_source.functions` says what it provides).

The schedule follows :mod:`cuvil_ir.tensor_ir.hoist`: the kernel's domain splits
at the hoist depth ``k``.

* **Pointwise** (no reduction): the domain is flattened; each program computes
  ``XBLOCK`` consecutive elements (a 1-D tile), indices recovered by division.
* **Rows** (reductions): the outer ``k`` indices are flattened into rows; each
  program owns ``XBLOCK`` rows (a ``[XBLOCK, 1]`` tile). Every distinct reduction
  (children first) is accumulated over a ``[XBLOCK, RBLOCK]`` tile of its flattened
  ranges, then the inner indices (the row's elements) are computed and stored
  ``RBLOCK`` at a time. Two variants in one function, picked per launch by the
  constexpr ``ONE_TILE``: when a row fits one tile, nothing loops and every
  reduction and the store share the tile's lanes, so each input element is loaded
  once (softmax reads its row once); otherwise each reduction and the store loop
  over the row in ``RBLOCK`` chunks.

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
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.hoist import hoist_depth, postorder_reduces
from cuvil_ir.tensor_ir.index_text import IndexPrinter
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram
from cuvil_ir.triton_source.functions import SIGNATURE_TYPES, TL_DTYPES, call, const
from cuvil_ir.triton_source.tiles import live_tiles


class TritonCodegenError(NotImplementedError):
    """Tensor IR the generator cannot express (a bug: lowering should have made it an extern)."""


@dataclass(frozen=True, slots=True)
class TritonRules:
    """What a target's Triton compiler accepts and how its programs map onto the
    hardware: the choices the generated text depends on (a target's policy, as data)."""

    #: each program loops over blocks ``tl.program_id(0), + tl.num_programs(0), ...``
    #: instead of owning one: a grid of a fixed number of programs (one per core)
    #: serves any size (Ascend's rule; on CUDA one program per block)
    persistent: bool = False
    #: long rows' mean and variance in one pass (Welford: a three-operand ``tl.reduce``
    #: and float64 accumulators); else two passes in the input's dtype
    welford: bool = True


#: the rules of the ``cuda`` target (one program per block, Welford)
CUDA_RULES = TritonRules()


@dataclass(frozen=True)
class TritonKernel:
    """One generated kernel: its module text and how to call it (plain data, cached)."""

    name: str
    #: the module text: imports and one ``@triton.jit`` function named ``name``
    source: str
    #: pointer parameters, in order: the written buffer first
    buffers: tuple[str, ...]
    sizes: tuple[sympy.Symbol, ...]
    #: (expression, "int" | "float"): ``d0`` elements or rows, ``d1`` (rows only) the
    #: longest extent a row is walked over, then the kernel's own
    derived: tuple[tuple[sympy.Expr, str], ...]
    args: tuple[tuple[str, DType], ...]
    #: rows (reductions) or pointwise
    rows: bool
    #: an integer division may meet a zero divisor: the last pointer parameter is an
    #: int32 flag the kernel sets (``p_err``)
    may_fail: bool
    #: parameter name -> Triton signature type (``*fp32``, ``i64``, ``constexpr`` ...)
    signature: tuple[tuple[str, str], ...]
    #: ahead-of-time compiled text per stage the target adds (``ptx``); empty if none
    compiled: tuple[tuple[str, str], ...] = ()
    #: most tiles (``[XBLOCK]`` or ``[XBLOCK, RBLOCK]`` values) live at once, per variant:
    #: ``(pointwise,)`` or ``(one tile, looped)`` (:mod:`cuvil_ir.triton_source.tiles`)
    tiles: tuple[int, ...] = ()
    #: the widest element of the kernel's buffers, in bytes (sizes a tile's memory)
    element_bytes: int = 4


_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def _identity(kind: str, dtype: DType) -> bool | int | float:
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


def _literal(v: bool | int | float) -> str:
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
class _Ctx:
    """Where lane-dependent values of one reduction (or of the store) are computed."""

    #: index into ``_Gen.scopes``
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
class _Scope:
    lines: list[str] = field(default_factory=list)
    indent: str = "    "
    memo: dict[Any, str] = field(default_factory=dict)


class _Gen(IndexPrinter):
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
        self.scopes: list[_Scope] = []
        self.row_syms: set[sympy.Symbol] = set()
        self.shape = "[XBLOCK]"
        self.row_names: dict[sympy.Symbol, str] = {}
        self.head_lines: list[str] = []
        self.loop_header = ""
        self.contexts: dict[tuple[Any, ...], _Ctx] = {}

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
    def index(self, value: object, ctx: _Ctx | None) -> str:
        return self.print_index(value, ctx)

    def symbol(self, s: sympy.Symbol, ctx: Any) -> str:
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

    def mod(self, a: sympy.Expr, b: sympy.Expr, ctx: Any) -> str:
        return f"cu.mod({self.index(a, ctx)}, {self.tensor_index(b, ctx)})"

    def floordiv(self, num: sympy.Expr, den: sympy.Expr, ctx: Any) -> str:
        return f"cu.floordiv({self.index(num, ctx)}, {self.tensor_index(den, ctx)})"

    def derived_size(self, e: sympy.Expr) -> str:
        return self.derived_arg(e, "int")

    def tensor_index(self, value: object, ctx: _Ctx | None) -> str:
        """An index as a tensor even when it is a literal or a size (``cu`` helpers read its dtype)."""
        e = sympy.sympify(value)
        text = self.index(e, ctx)
        if any(E.is_loop_symbol(s) for s in e.free_symbols):
            return text
        return f"tl.full([], {text}, tl.int64)"

    # -- values --------------------------------------------------------------------
    def lane_dependent(self, e: E.Expr) -> bool:
        return any(s not in self.row_syms for s in E.free_indices(e))

    def value(self, e: E.Expr, ctx: _Ctx | None) -> str:
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
        var = self.tmp()
        self.line(scope, f"{var} = {text}")
        self.scopes[scope].memo[key] = var
        if lane or (self.shape == "[XBLOCK]" and E.free_indices(e)):
            self.tile_vars.add(var)
        return var

    def compute(self, e: E.Expr, ctx: _Ctx | None) -> str:
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
            # a bool buffer holds bytes: Tritons before 3.4 (triton-ascend) load them as int8
            return f"({load} != 0)" if self.program.buffers[e.buf].dtype == DType.bool else load
        if isinstance(e, E.Index):
            x = sympy.sympify(e.expr)
            loop = any(E.is_loop_symbol(s) for s in x.free_symbols)
            if x.is_Integer:
                return const(int(x), e.dtype)
            if e.dtype.is_floating and not x.is_integer and not loop:
                return f"tl.full([], {self.derived_arg(x, 'float')}, tl.float32).to({TL_DTYPES[e.dtype]})"
            text = self.index(x, ctx)
            if not loop:  # a size is a plain int (or a constexpr 1) until it meets a tensor
                text = f"tl.full([], {text}, tl.int64)"
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
                self.line(scope, f"tl.store(p_err + {self.zeros(lane)}, 1, mask={mask} & ({args[1]} == 0))")
        return text

    def zeros(self, lane: bool) -> str:
        """An int64 zero tile of the scope's full shape (makes a pointer tile full size)."""
        if self.shape == "[XBLOCK]":
            return "tl.zeros([XBLOCK], tl.int64)"
        return "tl.zeros([XBLOCK, RBLOCK], tl.int64)" if lane else "tl.zeros([XBLOCK, 1], tl.int64)"

    # -- the kernel ------------------------------------------------------------------
    def generate(self) -> TritonKernel:
        k = self.kernel
        buf = self.program.buffers[k.buf]
        dims = [sympy.sympify(d) for d in k.domain]
        # unit dims index nothing: their index is 0 everywhere
        unit = {E.index_symbol(j): sympy.Integer(0) for j, d in enumerate(dims) if d == 1}
        body = E.substitute(k.body, unit)
        out_off = sympy.expand(
            sum((E.index_symbol(j) * sympy.sympify(st) for j, st in enumerate(buf.strides)), sympy.Integer(0))
        ).xreplace(unit)
        depth = hoist_depth(body)
        reds = postorder_reduces(body)
        rows = bool(reds)
        self.scopes = [_Scope()]
        numel = sympy.Integer(1)
        for d in dims[:depth] if rows else dims:
            numel = numel * d
        xnumel = self.derived_arg(sympy.expand(numel), "int#rows")  # d0
        self.xnumel = xnumel
        head = self.scopes[0]
        if not rows:
            self.row_syms = {E.index_symbol(j) for j in range(len(dims))}
            head.lines.append(
                "    x = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK).to(tl.int64)"
            )
            head.lines.append(f"    xmask = x < {xnumel}")
            self.tile_vars |= {"x", "xmask"}
            self.row_names = self.decompose("x", dims, range(len(dims)), head)
            val = self.value(body, None)
            self.store(buf.dtype, out_off, val, None, body.dtype)
            return self.finish(rows=False, branches=None)
        self.shape = "[XBLOCK, RBLOCK]"
        self.row_syms = {E.index_symbol(j) for j in range(depth)}
        # unit dims were replaced by 0: a row whose other dims are all 1 stores a column
        inner = [j for j in range(depth, len(dims)) if dims[j] != 1]
        inner_dims = [dims[j] for j in inner]
        extents = [sympy.expand(_prod(n for _, n in r.ranges)) for r in reds]
        inner_numel = sympy.expand(_prod(inner_dims))
        longest = sympy.Max(*extents, inner_numel) if inner else sympy.Max(*extents)
        self.derived_arg(longest, "int#row")  # d1: the launch picks the tile variant from it
        head.lines.append(
            "    x = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK).to(tl.int64)[:, None]"
        )
        head.lines.append(f"    xmask = x < {xnumel}")
        head.lines.append("    lane = tl.arange(0, RBLOCK).to(tl.int64)[None, :]")
        self.row_names = self.decompose("x", dims[:depth], range(depth), head)
        self.head_lines = head.lines
        branches = []
        for one_tile in (True, False):
            self.scopes = [_Scope(indent="        ")]
            self.contexts = {}
            online = {} if one_tile else _online_pairs(reds)
            welford = {} if one_tile or not self.rules.welford else _welford_pairs(reds)
            for r in reds:
                if (r, -1) in self.scopes[0].memo:
                    continue  # computed with its partner (online softmax, Welford)
                if r in online:
                    self.online_softmax(r, online[r])
                elif r in welford:
                    self.welford(r, welford[r])
                else:
                    self.reduce(r, one_tile, inner, inner_dims)
            if inner:
                ctx = self.context(tuple(inner_dims), one_tile, [E.index_symbol(j) for j in inner])
                val = self.value(body, ctx)
                self.store(buf.dtype, out_off, val, ctx, body.dtype)
                if not one_tile:
                    self.close_loop(ctx)
            else:
                val = self.value(body, None)
                self.store(buf.dtype, out_off, val, None, body.dtype)
            branches.append(self.scopes[0].lines)
        return self.finish(rows=True, branches=branches)

    def decompose(
        self, var: str, dims: list[Any], positions: range, scope: _Scope
    ) -> dict[sympy.Symbol, str]:
        """Names for the indices at ``positions`` (row-major ``dims``) recovered from the
        flat index ``var`` (unit dims were replaced by 0 already)."""
        return self.unflatten(var, [(E.index_symbol(p), d, f"i{p}") for p, d in zip(positions, dims)], scope)

    def unflatten(
        self, var: str, items: list[tuple[sympy.Symbol, Any, str]], scope: _Scope
    ) -> dict[sympy.Symbol, str]:
        names: dict[sympy.Symbol, str] = {}
        nonunit = [(s, d, n) for s, d, n in items if d != 1]
        for s, d, _ in items:
            if d == 1:
                names[s] = "0"
        rest = var
        for k, (sym, d, name) in enumerate(reversed(nonunit)):
            if k == len(nonunit) - 1:
                scope.lines.append(f"{scope.indent}{name} = {rest}")
            else:
                size = self.index(d, None)
                nxt = self.tmp("q")
                scope.lines.append(f"{scope.indent}{name} = {rest} % {size}")
                scope.lines.append(f"{scope.indent}{nxt} = {rest} // {size}")
                rest = nxt
            names[sym] = name
        return names

    def context(self, extents: tuple[Any, ...], one_tile: bool, syms: list[sympy.Symbol]) -> _Ctx:
        """The lanes walking ``extents`` (row-major): a loop of their own, or (one tile)
        the shared lanes, whose index variables ranges of equal extents share."""
        key = (extents, one_tile) if one_tile else (extents, len(self.contexts), one_tile)
        if one_tile and key in self.contexts:
            ctx = self.contexts[key]
            return ctx
        n = len(self.contexts)
        numel = self.index(sympy.expand(_prod(extents)), None)
        if one_tile:
            scope = 0
            base = "lane"
        else:
            outer = self.scopes[0]
            self.scopes.append(_Scope(indent=outer.indent + "    "))
            scope = len(self.scopes) - 1
            base = f"rbase{n}"
            self.loop_header = f"{outer.indent}for {base} in range(0, {numel}, RBLOCK):"
        s = self.scopes[scope]
        idx = "lane" if one_tile else f"ridx{n}"
        if not one_tile:
            s.lines.append(f"{s.indent}{idx} = {base} + lane")
        s.lines.append(f"{s.indent}lmask{n} = {idx} < {numel}")
        s.lines.append(f"{s.indent}mask{n} = xmask & lmask{n}")
        self.tile_vars.add(f"mask{n}")
        names = self.unflatten(
            idx, [(sym, extents[j], f"{sym.name[1:]}_{n}") for j, sym in enumerate(syms)], s
        )
        ctx = _Ctx(scope=scope, key=n, names=names, lane_mask=f"lmask{n}", mask=f"mask{n}", syms=list(syms))
        self.contexts[key] = ctx
        return ctx

    def close_loop(self, ctx: _Ctx) -> None:
        """Append the loop of ``ctx`` (its header, then its body) to the outer scope."""
        body = self.scopes[ctx.scope]
        outer = self.scopes[0]
        outer.lines.append(self.loop_header)
        outer.lines.extend(body.lines)

    def reduce(self, r: E.Reduce, one_tile: bool, inner: list[int], inner_dims: list[sympy.Expr]) -> None:
        syms = [s for s, _ in r.ranges]
        extents = tuple(sympy.sympify(n) for _, n in r.ranges)
        body = r.body
        if one_tile and tuple(inner_dims) == extents:
            # the same lanes as the store's: share its index variables (and loads)
            syms_here = [E.index_symbol(j) for j in inner]
        elif one_tile and (extents, True) in self.contexts:
            # the lanes of an earlier reduction over the same extents: share them
            syms_here = self.contexts[(extents, True)].syms
        else:
            syms_here = syms
        body = E.substitute(body, dict(zip(syms, syms_here)))
        ctx = self.context(extents, one_tile, syms_here)
        ident = _identity(r.kind, r.dtype)
        tl_t = TL_DTYPES[r.dtype]
        outer = self.scopes[0]
        if not one_tile:
            acc = self.tmp("acc")
            outer.lines.append(f"{outer.indent}{acc} = tl.full([XBLOCK, RBLOCK], {_literal(ident)}, {tl_t})")
        v = self.value(body, ctx)
        s = self.scopes[ctx.scope]
        masked = self.tmp("m")
        s.lines.append(f"{s.indent}{masked} = tl.where({ctx.mask}, {v}, {const(ident, r.dtype)})")
        self.tile_vars.add(masked)
        if not one_tile:
            self.tile_vars.add(acc)
        if one_tile:
            tile = masked
        else:
            s.lines.append(f"{s.indent}{acc} = {_combine(r.kind, r.dtype, acc, masked)}")
            self.close_loop(ctx)
            tile = acc
        res = self.tmp("red")
        for text in _final(r.kind, r.dtype, tile, res):
            outer.lines.append(f"{outer.indent}{text}")
        self.scopes[0].memo[(r, -1)] = res

    def online_softmax(self, mx: E.Reduce, sm: E.Reduce) -> None:
        """``max`` and ``sum(exp(body - max))`` over the same ranges in one pass over the
        row (the looped variant): per lane, a running max and a sum rescaled whenever
        the max grows (Milakov and Gimelshein, "Online normalizer calculation for
        softmax"), combined across lanes at the end."""
        syms = [s for s, _ in mx.ranges]
        extents = tuple(sympy.sympify(n) for _, n in mx.ranges)
        ctx = self.context(extents, False, syms)
        dt = mx.dtype
        tl_t = TL_DTYPES[dt]
        outer = self.scopes[0]
        am, asum = self.tmp("accm"), self.tmp("accs")
        outer.lines.append(f'{outer.indent}{am} = tl.full([XBLOCK, RBLOCK], float("-inf"), {tl_t})')
        outer.lines.append(f"{outer.indent}{asum} = tl.full([XBLOCK, RBLOCK], 0.0, {tl_t})")
        v = self.value(mx.body, ctx)
        sc = self.scopes[ctx.scope]
        ninf = const(-math.inf, dt)
        zero = const(0.0, dt)
        mv, mnew = self.tmp("m"), self.tmp("mnew")
        self.tile_vars |= {am, asum, mv, mnew}

        def exp(x: str) -> str:
            return call("exp", [x], [dt], dt)

        for text in (
            f"{mv} = tl.where({ctx.mask}, {v}, {ninf})",
            f"{mnew} = {_combine('max', dt, am, mv)}",
            f"{asum} = {asum} * tl.where({mnew} == {ninf}, {zero}, {exp(f'({am} - {mnew})')})"
            f" + tl.where({ctx.mask} & ({mnew} != {ninf}), {exp(f'({mv} - {mnew})')}, {zero})",
            f"{am} = {mnew}",
        ):
            sc.lines.append(f"{sc.indent}{text}")
        self.close_loop(ctx)
        rm, rs = self.tmp("red"), self.tmp("red")
        for text in _final("max", dt, am, rm):
            outer.lines.append(f"{outer.indent}{text}")
        scale = f"tl.where({am} == {ninf}, {zero}, {exp(f'({am} - {rm})')})"
        outer.lines.append(f"{outer.indent}{rs} = tl.sum({asum} * {scale}, 1).to({tl_t})[:, None]")
        self.scopes[0].memo[(mx, -1)] = rm
        self.scopes[0].memo[(sm, -1)] = rs

    def welford(self, total: E.Reduce, squares: E.Reduce) -> None:
        """``sum(x)`` and ``sum((x - sum(x) / n) ** 2)`` over the same ranges in one pass
        over the row (the looped variant): per lane Welford's running mean, sum of squared
        deviations and count (in float64), merged across lanes by ``cu.welford_combine``."""
        syms = [s for s, _ in total.ranges]
        extents = tuple(sympy.sympify(n) for _, n in total.ranges)
        ctx = self.context(extents, False, syms)
        dt = total.dtype
        tl_t = TL_DTYPES[dt]
        outer = self.scopes[0]
        m, q, c = self.tmp("accm"), self.tmp("accq"), self.tmp("accc")
        # in float64: a running mean's rounding grows with the data's offset from zero,
        # which two passes (deviations from the final mean) would not see
        for acc in (m, q, c):
            outer.lines.append(f"{outer.indent}{acc} = tl.full([XBLOCK, RBLOCK], 0.0, tl.float64)")
        v = self.value(total.body, ctx)
        sc = self.scopes[ctx.scope]
        cnew, delta, mnew = self.tmp("c"), self.tmp("d"), self.tmp("mnew")
        wide = self.tmp("v")
        self.tile_vars |= {m, q, c, cnew, delta, mnew, wide}
        sc.lines.append(f"{sc.indent}{wide} = {v}.to(tl.float64)")
        v = wide
        one = const(1.0, DType.f64)
        for text in (
            f"{cnew} = tl.where({ctx.mask}, {c} + {one}, {c})",
            f"{delta} = {v} - {m}",
            f"{mnew} = tl.where({ctx.mask}, {m} + {delta} / tl.maximum({cnew}, {one}), {m})",
            f"{q} = tl.where({ctx.mask}, {q} + {delta} * ({v} - {mnew}), {q})",
            f"{m} = {mnew}",
            f"{c} = {cnew}",
        ):
            sc.lines.append(f"{sc.indent}{text}")
        self.close_loop(ctx)
        rm, rq, rc = self.tmp("mean"), self.tmp("m2"), self.tmp("n")
        rs, rsq = self.tmp("red"), self.tmp("red")
        outer.lines.append(
            f"{outer.indent}{rm}, {rq}, {rc} = tl.reduce(({m}, {q}, {c}), 1, cu.welford_combine)"
        )
        outer.lines.append(f"{outer.indent}{rs} = ({rm} * {rc}).to({tl_t})[:, None]")
        outer.lines.append(f"{outer.indent}{rsq} = {rq}.to({tl_t})[:, None]")
        self.scopes[0].memo[(total, -1)] = rs
        self.scopes[0].memo[(squares, -1)] = rsq

    def store(self, dtype: DType, offset: sympy.Expr, val: str, ctx: _Ctx | None, vdtype: DType) -> None:
        lane = ctx is not None
        scope = ctx.scope if ctx is not None else 0
        s = self.scopes[scope]
        if vdtype != dtype:
            val = call("cast", [val], [vdtype], dtype)
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
            f"    # {_comment(str(self.kernel))}",
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


def _prod(xs: Any) -> sympy.Expr:
    out: Any = sympy.Integer(1)
    for x in xs:
        out = out * sympy.sympify(x)
    return out


def _online_pairs(reds: list[E.Reduce]) -> dict[E.Reduce, E.Reduce]:
    """Float ``max`` reductions whose softmax sum ``sum(exp(body - max))`` over the same
    extents is also in the kernel: max -> that sum (computed together, one pass)."""
    out: dict[E.Reduce, E.Reduce] = {}
    for sm in reds:
        b = sm.body
        if sm.kind != "sum" or not (isinstance(b, E.Call) and b.fn == "exp"):
            continue
        inner = b.args[0]
        if not (isinstance(inner, E.Call) and inner.fn == "sub" and isinstance(inner.args[1], E.Reduce)):
            continue
        mx = inner.args[1]
        if mx.kind != "max" or not mx.dtype.is_floating or mx.dtype != sm.dtype or mx in out:
            continue
        if [n for _, n in mx.ranges] != [n for _, n in sm.ranges]:
            continue
        renamed = E.substitute(inner.args[0], {s: m for (s, _), (m, _) in zip(sm.ranges, mx.ranges)})
        if renamed == mx.body:
            out[mx] = sm
    return out


def _welford_pairs(reds: list[E.Reduce]) -> dict[E.Reduce, E.Reduce]:
    """Float ``sum(x)`` reductions whose sum of squared deviations from the mean,
    ``sum((x - sum(x) / n) * (x - sum(x) / n))`` with ``n`` the number of terms, is also
    in the kernel: the sum -> that one (computed together, one pass)."""
    out: dict[E.Reduce, E.Reduce] = {}
    for sq in reds:
        b = sq.body
        if sq.kind != "sum" or not (isinstance(b, E.Call) and b.fn == "mul" and b.args[0] == b.args[1]):
            continue
        d = b.args[0]
        if not (isinstance(d, E.Call) and d.fn == "sub"):
            continue
        mean = d.args[1]
        if not (isinstance(mean, E.Call) and mean.fn == "div" and isinstance(mean.args[0], E.Reduce)):
            continue
        total, n = mean.args
        assert isinstance(total, E.Reduce)
        if total.kind != "sum" or not total.dtype.is_floating or total.dtype != sq.dtype or total in out:
            continue
        if [x for _, x in total.ranges] != [x for _, x in sq.ranges]:
            continue
        count = sympy.expand(_prod(x for _, x in total.ranges))
        if not _is_count(n, count):
            continue
        renamed = E.substitute(d.args[0], {s: t for (s, _), (t, _) in zip(sq.ranges, total.ranges)})
        if renamed == total.body:
            out[total] = sq
    return out


def _is_count(e: E.Expr, count: sympy.Expr) -> bool:
    """``e`` is the number ``count`` as a float (a constant, or a cast size)."""
    if isinstance(e, E.Const):
        return bool(count.is_Integer) and float(e.value) == float(count)
    if isinstance(e, E.Call) and e.fn == "cast" and len(e.args) == 1:
        return _is_count(e.args[0], count)
    if isinstance(e, E.Index):
        return bool(sympy.expand(sympy.sympify(e.expr) - count) == 0)
    return False


def _combine(kind: str, dtype: DType, acc: str, v: str) -> str:
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


def _final(kind: str, dtype: DType, tile: str, res: str) -> Iterator[str]:
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


def _comment(text: str) -> str:
    return " ".join(text.split())[:400]


def generate_triton(kernel: Kernel, program: TensorProgram, rules: TritonRules = CUDA_RULES) -> TritonKernel:
    """The Triton text of one Tensor IR kernel of ``program`` under a target's ``rules``
    (see the module doc)."""
    return _Gen(kernel, program, rules).generate()


__all__ = ["CUDA_RULES", "TritonCodegenError", "TritonKernel", "TritonRules", "generate_triton"]
