"""The Loop IR function around a scheduled kernel body: its buffer parameters (read,
written, both) and the size symbols and scalar arguments the body uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from cuvil_backend_cpu.loop_ir.nodes import (
    Accumulate,
    Let,
    Loop,
    LoopFunc,
    Param,
    Prefetch,
    Scratch,
    Stmt,
    Store,
)
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import Kernel, TensorProgram


def loop_func(kernel: Kernel, program: TensorProgram, body: Sequence[Stmt]) -> LoopFunc:
    """The kernel's Loop IR function: buffers read (``in``), the one written (``out``,
    ``inout`` when also read), and the sizes and scalar arguments the body uses."""
    reads = E.buffers_read(kernel.body)
    params = [Param(b, program.buffers[b].dtype, "in") for b in sorted(reads - {kernel.buf})]
    role = "inout" if kernel.buf in reads else "out"
    params.append(Param(kernel.buf, program.buffers[kernel.buf].dtype, role))
    sizes: set[sympy.Symbol] = set()
    args: dict[str, DType] = {}
    _collect(body, sizes, args)
    return LoopFunc(
        kernel.name,
        tuple(params),
        tuple(sorted(sizes, key=lambda s: s.name)),
        tuple(sorted(args.items())),
        tuple(body),
    )


def _collect(stmts: Sequence[Stmt], sizes: set[sympy.Symbol], args: dict[str, DType]) -> None:
    def syms_of(x: Any) -> None:
        for s in sympy.sympify(x).free_symbols:
            if isinstance(s, sympy.Symbol) and not E.is_loop_symbol(s):
                sizes.add(s)

    def expr(e: E.Expr) -> None:
        for x in E.walk(e):
            if isinstance(x, E.Load):
                syms_of(x.offset)
            elif isinstance(x, E.Index):
                syms_of(x.expr)
            elif isinstance(x, E.Arg):
                args[x.name] = x.dtype

    for s in stmts:
        if isinstance(s, Scratch):
            syms_of(s.extent)
            _collect(s.body, sizes, args)
        elif isinstance(s, Loop):
            syms_of(s.extent)
            syms_of(s.start)
            if s.work is not None:
                syms_of(s.work)
            _collect(s.body, sizes, args)
        elif isinstance(s, (Let, Accumulate)):
            expr(s.expr)
        elif isinstance(s, Store):
            syms_of(s.offset)
            expr(s.expr)
        elif isinstance(s, Prefetch):
            syms_of(s.offset)
            syms_of(s.extent)
            syms_of(s.limit)
