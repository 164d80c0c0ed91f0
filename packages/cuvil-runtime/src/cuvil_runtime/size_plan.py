"""What one binding of a program's size symbols fixes, made once per binding.

A :class:`SizePlan` holds the arena of the memory plan and each planned buffer's
slice of it (and its address), the derived kernel arguments, the extern attributes
and the shapes of outputs whose sizes are expressions: everything of a call that
depends only on the sizes (:func:`make_plan`; :class:`PlanMaker` computes the same plan from one generated
function). The runner keeps a few per thread (``ProgramRunner.plan``). Also here: the size symbols a program uses
(:func:`program_symbols`) and whether a value uses a size computed from data
(:func:`is_late`, see [Note: sizes from data] in cuvil_runtime.runner).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy
import torch

from cuvil_ir.symbolic import EXACT_NAMESPACE, evaluate, exact_code
from cuvil_ir.tensor_ir import expr as E
from cuvil_ir.tensor_ir.memory import ALIGN
from cuvil_ir.tensor_ir.program import Extern, Kernel, ScalarRef, TensorProgram, View
from cuvil_runtime.executor import evaluate_attr
from cuvil_runtime.target import Launch


@dataclass
class SizePlan:
    """What one size binding needs: arena buffers and per-step prepared arguments."""

    arena: torch.Tensor
    temps: dict[str, torch.Tensor]
    ptrs: dict[str, int]
    derived: dict[str, tuple[int, ...]]
    attrs: dict[str, dict[str, Any]]
    #: outputs whose sizes or strides are expressions: (shape, strides) per buffer
    alloc: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    #: the native runs' tables for this binding, made at its second call (``None`` before;
    #: [Note: native runs] in :mod:`cuvil_runtime.native_runs`)
    native: list[Any] | None = None
    #: whether the binding had its first call (which runs every step from Python)
    native_seen: bool = False


def make_plan(
    program: TensorProgram,
    kernels: dict[str, Launch],
    late: set[sympy.Symbol],
    alloc_in_plan: Sequence[str],
    b: dict[sympy.Symbol, int],
) -> SizePlan:
    """The plan of ``program`` for the size binding ``b``: its arena and the slices of it
    each planned buffer takes, the derived arguments of ``kernels`` and the extern
    attributes that use no ``late`` size (those are evaluated per call: see [Note: sizes
    from data] in cuvil_runtime.runner), and the shapes and strides of the outputs in
    ``alloc_in_plan``."""
    prog = program
    plan = prog.plan
    offsets = []
    total = 0
    for s in plan.slots:
        offsets.append(total)
        size = max(int(evaluate(x, b)) for x in s.sizes)
        total += (size + ALIGN - 1) // ALIGN * ALIGN
    arena = torch.empty(max(total, 1), dtype=torch.uint8, device=prog.device)
    temps: dict[str, torch.Tensor] = {}
    ptrs: dict[str, int] = {}
    for name, slot in plan.slot_of.items():
        buf = prog.buffers[name]
        shape = tuple(int(evaluate(d, b)) for d in buf.shape)
        n = int(evaluate(buf.nbytes, b))
        t = arena[offsets[slot] : offsets[slot] + n].view(buf.dtype.torch)
        if buf.order is None:
            t = t.view(shape)
        else:
            t = t.as_strided(shape, tuple(int(evaluate(d, b)) for d in buf.strides))
        temps[name] = t
        ptrs[name] = t.data_ptr()
    derived = {
        k: tuple(kernel_value(evaluate(e, b), t) for e, t in launch.derived)
        for k, launch in kernels.items()
        if launch.derived and not is_late(tuple(e for e, _ in launch.derived), late)
    }
    attrs = {}
    for s in prog.steps:
        if isinstance(s, Extern) and not is_late(s.node.attrs, late):
            attrs[s.name] = {k: evaluate_attr(v, b) for k, v in s.node.attrs}
    alloc = {
        name: (
            tuple(int(evaluate(d, b)) for d in buf.shape),
            tuple(int(evaluate(d, b)) for d in buf.strides),
        )
        for name in alloc_in_plan
        for buf in (prog.buffers[name],)
    }
    return SizePlan(arena, temps, ptrs, derived, attrs, alloc)


# [Note: compiled size plans]
# A new size binding (a decode step's context length, a serving step's token and sequence
# counts) needs a new plan, and make_plan evaluates every buffer's shape, size and strides,
# every derived kernel argument and extern attribute expression by expression through
# sympy-keyed lookups: 3-8 ms for a 4-layer decoder's step (140 buffers), paid by a quarter
# of a serving engine's steps. PlanMaker prints every one of those expressions once, as
# exact Python (cuvil_ir.symbolic.exact_code: the guards' arithmetic), into one generated
# function of the size values, and builds the tensors from its numbers: the same plan as
# make_plan's (tests compare the two), for a fraction of the time. An expression the
# printer cannot write exactly is evaluated by evaluate() from inside the function; a
# binding the function fails on (a division by zero) is made by make_plan, which says why.


@dataclass(frozen=True)
class _PlanCode:
    """What :class:`PlanMaker` made once: the generated function and how to read its numbers."""

    #: ``numbers(_b, *sizes) -> (slot sizes, (temporaries' shapes, their strides), derived
    #: arguments, output allocations)``
    numbers: Callable[..., tuple[Any, ...]]
    temps: tuple[tuple[str, int, torch.dtype], ...]  # (buffer, slot, dtype) in the function's order
    derived: tuple[str, ...]  # kernels, in the function's order
    #: per extern step: (attribute, value, whether it holds a size) in the step's order
    attrs: tuple[tuple[str, tuple[tuple[str, Any, bool], ...]], ...]
    source: str


class PlanMaker:
    """:func:`make_plan` for one program, its expressions compiled into one function
    ([Note: compiled size plans]). Thread-safe: the function is made at the first plan
    (twice at worst, each time whole) and read-only after."""

    def __init__(
        self,
        program: TensorProgram,
        kernels: dict[str, Launch],
        late: set[sympy.Symbol],
        alloc_in_plan: Sequence[str],
        symbols: Sequence[sympy.Symbol],
    ) -> None:
        self.program = program
        self.kernels = kernels
        self.late = late
        self.alloc_in_plan = alloc_in_plan
        self.symbols = tuple(symbols)
        self._code: _PlanCode | None = None

    @property
    def source(self) -> str:
        """The generated function's source ("" before the first plan; tests, debugging)."""
        return self._code.source if self._code is not None else ""

    def __call__(self, b: dict[sympy.Symbol, int]) -> SizePlan:
        code = self._code
        if code is None:
            code = self._code = self._generate()
        try:
            slots, (shapes, strides), derived, alloc = code.numbers(b, *[b[s] for s in self.symbols])
        except Exception:  # noqa: BLE001 -- make_plan evaluates it (and says what is wrong)
            return self._reference(b)
        offsets = []
        total = 0
        for size in slots:
            offsets.append(total)
            total += (size + ALIGN - 1) // ALIGN * ALIGN
        arena = torch.empty(max(total, ALIGN), dtype=torch.uint8, device=self.program.device)
        typed: dict[torch.dtype, torch.Tensor] = {}
        temps: dict[str, torch.Tensor] = {}
        ptrs: dict[str, int] = {}
        for (name, slot, dtype), shape, stride in zip(code.temps, shapes, strides):
            whole = typed.get(dtype)
            if whole is None:
                whole = typed[dtype] = arena.view(dtype)
            t = torch.as_strided(whole, shape, stride, offsets[slot] // whole.element_size())
            temps[name] = t
            ptrs[name] = t.data_ptr()
        attrs = {
            step: {k: evaluate_attr(v, b) if sized else v for k, v, sized in items}
            for step, items in code.attrs
        }
        return SizePlan(
            arena, temps, ptrs, dict(zip(code.derived, derived)), attrs, dict(zip(self.alloc_in_plan, alloc))
        )

    def _reference(self, b: dict[sympy.Symbol, int]) -> SizePlan:
        return make_plan(self.program, self.kernels, self.late, self.alloc_in_plan, b)

    def _generate(self) -> _PlanCode:
        prog = self.program
        names = {s: f"s{i}" for i, s in enumerate(self.symbols)}
        fallback: list[Any] = []
        code = _printer(names, fallback)

        def tup(parts: Sequence[str]) -> str:
            return "(" + "".join(f"{p}, " for p in parts) + ")"

        slots = [f"max({', '.join(code(x) for x in s.sizes)}, 0)" for s in prog.plan.slots]
        temps = tuple((n, slot, prog.buffers[n].dtype.torch) for n, slot in prog.plan.slot_of.items())
        shapes, strides = [], []
        for n, _, _ in temps:
            buf = prog.buffers[n]
            shapes.append(tup([code(d) for d in buf.shape]))
            # row-major as torch's view() strides them (make_plan views the arena)
            strides.append(
                f"_contiguous({shapes[-1]})" if buf.order is None else tup([code(d) for d in buf.strides])
            )
        derived_names = tuple(
            k
            for k, launch in self.kernels.items()
            if launch.derived and not is_late(tuple(e for e, _ in launch.derived), self.late)
        )
        derived = [
            tup([f"{'float' if t == 'float' else 'int'}({code(e)})" for e, t in self.kernels[k].derived])
            for k in derived_names
        ]
        # extern attributes: constants evaluated once, those with sizes per plan
        attrs = tuple(
            (s.name, tuple(_attr(k, v) for k, v in s.node.attrs))
            for s in prog.steps
            if isinstance(s, Extern) and not is_late(s.node.attrs, self.late)
        )
        alloc = [
            f"({tup([code(d) for d in buf.shape])}, {tup([code(d) for d in buf.strides])})"
            for name in self.alloc_in_plan
            for buf in (prog.buffers[name],)
        ]
        args = "".join(f", {names[s]}" for s in self.symbols)
        source = (
            f"def numbers(_b{args}):\n"
            f"    return ({tup(slots)}, ({tup(shapes)}, {tup(strides)}), {tup(derived)}, {tup(alloc)})\n"
        )
        ns: dict[str, Any] = {
            **EXACT_NAMESPACE,
            "_num": _num,
            "_ev": evaluate,
            "_E": tuple(fallback),
            "_contiguous": _contiguous,
        }
        exec(compile(source, f"<cuvil size plan {prog.name}>", "exec"), ns)  # our own printed code
        return _PlanCode(ns["numbers"], temps, derived_names, attrs, source)


def _printer(names: dict[sympy.Symbol, str], fallback: list[Any]) -> Callable[[Any], str]:
    """Prints an expression as exact Python of the size arguments ``names``; one it cannot
    print is appended to ``fallback`` and evaluated by evaluate() from the bindings ``_b``."""

    def code(e: Any) -> str:
        if isinstance(e, int):
            return str(e)
        try:
            return f"_num({exact_code(e, names)})"
        except Exception:  # noqa: BLE001 -- not printable exactly (or an unbound symbol)
            fallback.append(e)
            return f"_ev(_E[{len(fallback) - 1}], _b)"

    return code


def numbers_function(
    exprs: Sequence[Any], symbols: Sequence[sympy.Symbol], label: str
) -> Callable[..., tuple[Any, ...]]:
    """``f(_b, *sizes)``: the values of ``exprs`` for the bindings ``_b`` (the values of
    ``symbols`` also passed in order), printed once as one function ([Note: compiled size
    plans]), as :func:`evaluate` gives them."""
    names = {s: f"s{i}" for i, s in enumerate(symbols)}
    fallback: list[Any] = []
    code = _printer(names, fallback)
    parts = "".join(f"{code(e)}, " for e in exprs)
    source = f"def numbers(_b{''.join(f', {names[s]}' for s in symbols)}):\n    return ({parts})\n"
    ns: dict[str, Any] = {**EXACT_NAMESPACE, "_num": _num, "_ev": evaluate, "_E": tuple(fallback)}
    exec(compile(source, f"<cuvil {label}>", "exec"), ns)  # our own printed code
    return ns["numbers"]  # type: ignore[no-any-return]


def _attr(key: str, value: Any) -> tuple[str, Any, bool]:
    syms: set[sympy.Symbol] = set()
    add_symbols(syms, value)
    return (key, value, True) if syms else (key, evaluate_attr(value, {}), False)


def _num(v: Any) -> Any:
    """An exact value as evaluate() gives it: an int if it is whole, else a float."""
    if type(v) is int:
        return v
    if isinstance(v, bool) or (isinstance(v, Fraction) and v.denominator == 1):
        return int(v)
    return float(v)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides as torch gives them (a dimension of size 0 counts as 1)."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def is_late(x: Any, late: set[sympy.Symbol]) -> bool:
    """``x`` (an expression or attribute tree) uses one of the ``late`` sizes (computed
    from tensor data)."""
    syms: set[sympy.Symbol] = set()
    add_symbols(syms, x)
    return bool(syms & late)


def add_symbols(syms: set[sympy.Symbol], x: Any) -> None:
    if isinstance(x, sympy.Basic):
        syms.update(s for s in x.free_symbols if isinstance(s, sympy.Symbol))
    elif isinstance(x, tuple):
        for y in x:
            add_symbols(syms, y)
    elif hasattr(x, "items") and not isinstance(x, dict):
        for _, y in x.items:
            add_symbols(syms, y)


def kernel_value(v: Any, kind: str) -> Any:
    return float(v) if kind == "float" else int(v)


def program_symbols(program: TensorProgram) -> tuple[sympy.Symbol, ...]:
    """Every size symbol the program's sizes, kernels and attributes use, sorted by name."""
    syms: set[sympy.Symbol] = set()

    def add(x: Any) -> None:
        if isinstance(x, sympy.Basic):
            syms.update(s for s in x.free_symbols if isinstance(s, sympy.Symbol) and not E.is_loop_symbol(s))
        elif isinstance(x, tuple):
            for y in x:
                add(y)
        elif hasattr(x, "items") and not isinstance(x, dict):
            for _, y in x.items:
                add(y)

    for b in program.buffers.values():
        add(tuple(b.shape))
    for s in program.steps:
        if isinstance(s, Kernel):
            add(tuple(s.domain))
            for x in E.walk(s.body):
                if isinstance(x, E.Load):
                    add(x.offset)
                elif isinstance(x, E.Index):
                    add(x.expr)
                elif isinstance(x, E.Reduce):
                    add(tuple(n for _, n in x.ranges))
        else:
            for o in s.inputs:
                if isinstance(o, View):
                    add((*o.shape, *o.strides, o.offset))
                elif isinstance(o, ScalarRef) and isinstance(o.value, E.Index):
                    add(o.value.expr)
            for _, v in s.node.attrs:
                add(v)
    for out in program.outputs:
        if isinstance(out, E.Index):
            add(out.expr)
    add(tuple(program.outer_symbols))
    return tuple(sorted(syms, key=lambda s: s.name))
