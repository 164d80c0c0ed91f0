"""The schedule of a Triton kernel: how its domain maps onto programs, tiles and loops
(see docs/cuda-backend.md). It follows :mod:`cuvil_ir.tensor_ir.hoist`: the kernel's
domain splits at the hoist depth ``k``.

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
  over the row in ``RBLOCK`` chunks, and the pairs
  :mod:`cuvil_ir.triton_source.patterns` finds are computed in one pass.

How each value reads is :mod:`cuvil_ir.triton_source.render`'s job.
"""

from __future__ import annotations

import math
from typing import Any

import sympy

from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.hoist import hoist_depth, postorder_reduces
from cuvil_ir.triton_source.functions import HALF, TL_DTYPES, call, const
from cuvil_ir.triton_source.kernel import TritonCodegenError, TritonKernel
from cuvil_ir.triton_source.patterns import online_pairs, prod, welford_pairs
from cuvil_ir.triton_source.render import Ctx, Renderer, Scope, combine, final, identity, literal


class Scheduler(Renderer):
    """One kernel's generation: the schedule around :class:`Renderer`'s values."""

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
        self.scopes = [Scope()]
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
        extents = [sympy.expand(prod(n for _, n in r.ranges)) for r in reds]
        inner_numel = sympy.expand(prod(inner_dims))
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
            self.scopes = [Scope(indent="        ")]
            self.contexts = {}
            online = {} if one_tile else online_pairs(reds)
            welford = {} if one_tile or not self.rules.welford else welford_pairs(reds)
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

    def decompose(self, var: str, dims: list[Any], positions: range, scope: Scope) -> dict[sympy.Symbol, str]:
        """Names for the indices at ``positions`` (row-major ``dims``) recovered from the
        flat index ``var`` (unit dims were replaced by 0 already)."""
        return self.unflatten(var, [(E.index_symbol(p), d, f"i{p}") for p, d in zip(positions, dims)], scope)

    def unflatten(
        self, var: str, items: list[tuple[sympy.Symbol, Any, str]], scope: Scope
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

    def context(self, extents: tuple[Any, ...], one_tile: bool, syms: list[sympy.Symbol]) -> Ctx:
        """The lanes walking ``extents`` (row-major): a loop of their own, or (one tile)
        the shared lanes, whose index variables ranges of equal extents share."""
        key = (extents, one_tile) if one_tile else (extents, len(self.contexts), one_tile)
        if one_tile and key in self.contexts:
            ctx = self.contexts[key]
            return ctx
        n = len(self.contexts)
        numel = self.index(sympy.expand(prod(extents)), None)
        if one_tile:
            scope = 0
            base = "lane"
        else:
            outer = self.scopes[0]
            self.scopes.append(Scope(indent=outer.indent + "    "))
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
        ctx = Ctx(scope=scope, key=n, names=names, lane_mask=f"lmask{n}", mask=f"mask{n}", syms=list(syms))
        self.contexts[key] = ctx
        return ctx

    def close_loop(self, ctx: Ctx) -> None:
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
        if r.dtype in HALF and r.kind in ("sum", "prod"):
            # every half reduction accumulates in float32 ([Note: opmath]); rounding the
            # accumulator at each step would not be eager's result
            raise TritonCodegenError(f"a {r.kind} accumulated in {r.dtype.value}")
        ident = identity(r.kind, r.dtype)
        tl_t = TL_DTYPES[r.dtype]
        outer = self.scopes[0]
        if not one_tile:
            acc = self.tmp("acc")
            outer.lines.append(f"{outer.indent}{acc} = tl.full([XBLOCK, RBLOCK], {literal(ident)}, {tl_t})")
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
            s.lines.append(f"{s.indent}{acc} = {combine(r.kind, r.dtype, acc, masked)}")
            self.close_loop(ctx)
            tile = acc
        res = self.tmp("red")
        for text in final(r.kind, r.dtype, tile, res):
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
            f"{mnew} = {combine('max', dt, am, mv)}",
            f"{asum} = {asum} * tl.where({mnew} == {ninf}, {zero}, {exp(f'({am} - {mnew})')})"
            f" + tl.where({ctx.mask} & ({mnew} != {ninf}), {exp(f'({mv} - {mnew})')}, {zero})",
            f"{am} = {mnew}",
        ):
            sc.lines.append(f"{sc.indent}{text}")
        self.close_loop(ctx)
        rm, rs = self.tmp("red"), self.tmp("red")
        for text in final("max", dt, am, rm):
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


__all__ = ["Scheduler"]
