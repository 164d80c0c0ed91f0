"""Tensor IR verifier: names, definitions before use, arities and index ranks.

:func:`verify` checks a :class:`~cuvil_ir.tensor_ir.program.TensorProgram` (and each
region program of its control steps) and raises :class:`TensorVerifyError` naming
the first problem and the step it is in:

- every program input names a declared buffer (a tensor) or is a scalar argument;
  every buffer's kind is one of ``BUFFER_KINDS`` and its key is its name;
- every step reads only buffers that are inputs or were written by an earlier step
  (an arena temporary read before it is written would be garbage), and writes only
  declared buffers (a scalar result of an extern or control step is an argument of
  the steps after it); each step's name is unique;
- a kernel's domain has its buffer's rank; its body uses only the index symbols of
  that rank (``_i0`` .. ``_i<rank-1>``) and the reduction symbols an enclosing
  ``Reduce`` binds; every ``Call`` is a known function (:data:`~cuvil_ir.tensor_ir.expr.FUNCTIONS`)
  with its arity, or a native call; every ``Reduce`` kind is known; every ``Arg`` is
  a scalar input, a seed or an outer symbol of the program;
- every output is a written buffer or a scalar expression.
"""

from __future__ import annotations

from typing import Any

import sympy

from cuvil_ir.graph_ir.types import ScalarType
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.program import BUFFER_KINDS, Control, Extern, Kernel, ScalarRef, TensorProgram, View


class TensorVerifyError(ValueError):
    pass


def verify(program: TensorProgram) -> TensorProgram:
    """Raise :class:`TensorVerifyError` describing the first problem; return ``program``."""
    _Checker(program).run()
    return program


class _Checker:
    def __init__(self, program: TensorProgram) -> None:
        self.p = program
        self.written: set[str] = set()
        self.args: set[str] = {i.name for i in program.inputs if not i.is_tensor}
        self.args |= set(program.seeds) | {s.name for s in program.outer_symbols}

    def fail(self, where: str, what: str) -> None:
        raise TensorVerifyError(f"program {self.p.name}: {where}: {what}")

    def run(self) -> None:
        p = self.p
        for name, buf in p.buffers.items():
            if buf.name != name:
                self.fail(f"buffer %{name}", f"declared under another name (%{buf.name})")
            if buf.kind not in BUFFER_KINDS:
                self.fail(f"buffer %{name}", f"unknown kind {buf.kind!r}")
        for inp in p.inputs:
            if inp.is_tensor:
                if inp.name not in p.buffers:
                    self.fail(f"input {inp.name}", "names no buffer")
                self.written.add(inp.name)
        seen: set[str] = set()
        for step in p.steps:
            if step.name in seen:
                self.fail(f"step {step.name}", "the name is used twice")
            seen.add(step.name)
            if isinstance(step, Kernel):
                self.kernel(step)
            elif isinstance(step, Extern):
                self.operands(step.name, step.inputs)
                self.outputs(step.name, step.outputs, step.node)
            elif isinstance(step, Control):
                self.operands(step.name, step.inputs)
                for region in step.regions:
                    try:
                        verify(region)
                    except TensorVerifyError as e:
                        self.fail(f"step {step.name}", f"region: {e}")
                self.outputs(step.name, step.outputs, step.node)
            else:
                self.fail(f"step {getattr(step, 'name', step)!r}", f"unknown step type {type(step).__name__}")
        for k, out in enumerate(p.outputs):
            if isinstance(out, str):
                if out not in p.buffers:
                    self.fail(f"output {k}", f"names no buffer (%{out})")
                if out not in self.written:
                    self.fail(f"output {k}", f"%{out} is never written")
            else:
                self.expr(f"output {k}", out, 0, frozenset())

    def read(self, where: str, buf: str) -> None:
        if buf not in self.p.buffers:
            self.fail(where, f"reads an undeclared buffer %{buf}")
        if buf not in self.written:
            self.fail(where, f"reads %{buf} before any step writes it")

    def operands(self, where: str, operands: tuple[Any, ...]) -> None:
        for o in operands:
            if isinstance(o, View):
                self.read(f"step {where}", o.buf)
            elif isinstance(o, ScalarRef):
                self.expr(f"step {where}", o.value, 0, frozenset())
            else:
                self.fail(f"step {where}", f"unknown operand {o!r}")

    def outputs(self, where: str, names: tuple[str, ...], node: Any) -> None:
        types = [v.type for v in node.outputs]
        for k, name in enumerate(names):
            if k < len(types) and isinstance(types[k], ScalarType):
                self.args.add(name)  # a scalar result: an argument of the steps after it
                continue
            if name not in self.p.buffers:
                self.fail(f"step {where}", f"writes an undeclared buffer %{name}")
            self.written.add(name)

    def kernel(self, k: Kernel) -> None:
        where = f"kernel {k.name}"
        buf = self.p.buffers.get(k.buf)
        if buf is None:
            self.fail(where, f"writes an undeclared buffer %{k.buf}")
            return
        if len(k.domain) != len(buf.shape):
            self.fail(where, f"domain of rank {len(k.domain)} for %{k.buf} of rank {len(buf.shape)}")
        self.expr(where, k.body, len(k.domain), frozenset())
        self.written.add(k.buf)

    def index(self, where: str, x: Any, rank: int, bound: frozenset[sympy.Symbol]) -> None:
        """An index expression may use ``_i0`` .. ``_i<rank-1>`` and the symbols ``bound``."""
        for s in sympy.sympify(x).free_symbols:
            if not E.is_loop_symbol(s) or s in bound:
                continue
            name = s.name
            if name.startswith("_i") and name[2:].isdigit() and int(name[2:]) < rank:
                continue
            self.fail(where, f"uses the loop symbol {name} outside its range (rank {rank})")

    def expr(self, where: str, e: E.Expr, rank: int, bound: frozenset[sympy.Symbol]) -> None:
        if isinstance(e, E.Load):
            self.read(where, e.buf)
            self.index(where, e.offset, rank, bound)
        elif isinstance(e, E.Index):
            self.index(where, e.expr, rank, bound)
        elif isinstance(e, E.Arg):
            if e.name not in self.args:
                self.fail(where, f"reads the scalar {e.name}, which is no input, seed or outer symbol")
        elif isinstance(e, E.Call):
            if not e.fn.startswith(E.NATIVE):
                arity = E.FUNCTIONS.get(e.fn)
                if arity is None:
                    self.fail(where, f"calls an unknown function {e.fn!r}")
                elif arity != len(e.args):
                    self.fail(where, f"calls {e.fn} with {len(e.args)} arguments (it takes {arity})")
            for a in e.args:
                self.expr(where, a, rank, bound)
        elif isinstance(e, E.Reduce):
            if e.kind not in E.REDUCE_KINDS:
                self.fail(where, f"an unknown reduction {e.kind!r}")
            inner = bound
            for s, extent in e.ranges:
                self.index(where, extent, rank, bound)
                inner = inner | {s}
            self.expr(where, e.body, rank, inner)
        elif isinstance(e, (E.Const, E.Var)):
            pass
        else:
            self.fail(where, f"unknown expression {e!r}")


__all__ = ["TensorVerifyError", "verify"]
