"""Native runs: consecutive steps of a program called from C in one call.

# [Note: native runs]
# A program's wrapper calls each step from Python: a generated kernel through ctypes, an
# out-variant extern through its Python closure (argument checks, a parameter block packed,
# then ctypes). Between two steps the interpreter runs and the GIL is taken back. A *native
# run* is a stretch of consecutive steps that are all C functions taking integer-class
# arguments (the backend's kernels with a ``Launch.address``, and out-variant externs with a
# :class:`~cuvil_runtime.target.NativeExtern` form): the wrapper makes one call into the
# backend's step runner (``NativeHooks.step_runner``, the cpu target's ``step_runner.c``),
# which calls each step's function by its address with the arguments of three tables. The
# call is made by ctypes, so the GIL is released from the run's first step to its last.
#
# What a run computes is what its steps compute from Python: the same functions, the same
# arguments. The tables are made once per size binding, at the binding's second call (kept
# on its SizePlan, so per thread as plans are; making them costs a few milliseconds of
# Python, more than a call saves: a binding called once, such as each decode step of a
# dynamic cache, runs from Python and pays nothing): addresses of arena buffers, sizes,
# derived kernel arguments and each extern's parameter blocks are numbers there; what
# changes per call (the addresses of inputs and outputs, the thread count) is written into
# the first slots by one ``struct.pack_into`` before the run. An extern's ``prepare`` sees the
# operands' dtypes, shapes and strides for the binding and may refuse it (``None``: a
# prefill's many rows, which its out-variant runs through a GEMM); a binding any step of a
# run refuses runs that run's steps from Python, as before (the wrapper has both). A
# nonzero return of a step stops the run there and raises what the Python call would
# have raised (a kernel's integer division by zero, an extern's own error).
#
# A functional extern's result is a new tensor, so it is not in a run, with one exception: a
# call marked to overwrite a whole argument of the program in place ([Note: updates in place]
# in cuvil_ir/graph_ir/in_place.py: a static cache's ``index_copy_``), whose result *is* that
# argument, with a C form (the cpu target's ``cuvil_index_copy``). Its result is bound to the
# argument before the run, and a run holding one is taken only in a call that may write
# arguments (``in_place.allowed()``, checked per call: the storage check of that note); any
# other call runs the run's steps from Python, whose extern clones the argument as before.
#
# Not in a run: steps that take tensors (an emulated kernel), floats (a kernel's float
# scalars), sizes computed from data, other functional externs and control flow; runs of one
# kernel (one call either way). ``CUVIL_NATIVE_RUNS=0`` turns native runs off (the wrapper
# calls every step from Python).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from cuvil_ir.tensor_ir.program import Extern, TensorProgram, View
from cuvil_runtime.size_plan import numbers_function
from cuvil_runtime.target import Launch, NativeExtern, NativeOperand

#: arguments a step may take (the step runner's limit: its loader checks the two agree)
MAX_ARGS = 32


def enabled() -> bool:
    """Whether wrappers made now use native runs (``CUVIL_NATIVE_RUNS=0``: no)."""
    return os.environ.get("CUVIL_NATIVE_RUNS", "1") != "0"


@dataclass(frozen=True)
class Source:
    """Where one address or number of a run comes from: ``("call", i)`` per-call slot ``i``
    (the wrapper writes it), ``("ptr", buf)`` the plan's address of an arena buffer,
    ``("size", symbol)``, ``("derived", kernel, i)``, ``("int", value)``."""

    kind: str
    key: Any
    index: int = 0


@dataclass
class Step:
    """One step of a run as the wrapper was generated: a kernel (``launch``) or an
    out-variant extern (``native`` and the Tensor IR step)."""

    name: str
    launch: Launch | None = None
    extern: Extern | None = None
    native: NativeExtern | None = None
    #: a functional extern that overwrites a whole input in place (its result is that input):
    #: the run is taken only in a call that may write it ([Note: updates in place])
    in_place: bool = False


@dataclass
class Run:
    """A native run of the wrapper: its steps and its per-call values (the generated
    expressions, in slot order)."""

    index: int
    steps: list[Step]
    calls: list[str]
    #: per buffer the run reads or writes: where its address comes from
    bases: dict[str, Source]
    threads: int | None = None  # the per-call slot of the thread count, if any step takes it
    #: the extern operands' sizes for a binding (printed at the first tables: :func:`make_tables`)
    numbers: Callable[..., tuple[Any, ...]] | None = None

    def call_slot(self, expr: str) -> Source:
        if expr not in self.calls:
            self.calls.append(expr)
        return Source("call", None, self.calls.index(expr))


class Tables:
    """The tables of one run for one size binding (kept alive with the plan), and the
    header the step runner reads: ``[n, steps, args, ents, slots, rc]`` addresses."""

    def __init__(
        self, run: Run, steps: list[int], args: list[int], ents: list[int], slots: list[int]
    ) -> None:
        self.run = run
        self.steps = _array(steps)
        self.args = _array(args)
        self.ents = _array(ents)
        self.slots = _array(slots)
        self.rc = _array([0])
        self.head = _array(
            [
                len(steps) // 4,
                *(ctypes.addressof(a) for a in (self.steps, self.args, self.ents, self.slots, self.rc)),
            ]
        )
        #: what the wrapper passes to the step runner
        self.address = ctypes.addressof(self.head)


def _array(values: Sequence[int]) -> Any:
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def packer(run: Run) -> Callable[..., None] | None:
    """``pack_into(slots, 0, *values)`` for the run's per-call values (None: it has none)."""
    return struct.Struct(f"{len(run.calls)}q").pack_into if run.calls else None


def make_tables(
    run: Run,
    program: TensorProgram,
    plan: Any,
    symbols: Sequence[sympy.Symbol],
    key: Sequence[int],
) -> Tables | None:
    """The run's tables for the binding of ``symbols`` to ``key`` (plan: its
    :class:`SizePlan`), or ``None`` where an extern's ``prepare`` refuses this binding. Made
    at a binding's second call; the operands' sizes come from one function printed once per
    run."""
    b = dict(zip(symbols, key))
    if run.numbers is None:
        run.numbers = numbers_function(_extern_exprs(run, program), symbols, f"native run {run.index}")
    values = iter(run.numbers(b, *key))
    slots: list[int] = [0] * len(run.calls)
    steps: list[int] = []
    args: list[int] = []
    ents: list[int] = []
    consts: dict[int, int] = {}

    def const(v: int) -> int:
        if v not in consts:
            consts[v] = len(slots)
            slots.append(v)
        return consts[v]

    def slot_of(src: Source) -> int:
        if src.kind == "call":
            return src.index
        if src.kind == "ptr":
            return const(plan.ptrs[src.key])
        if src.kind == "size":
            return const(int(b[src.key]))
        if src.kind == "derived":
            return const(int(plan.derived[src.key][src.index]))
        return const(int(src.key))

    def item(a: Any, where: list[tuple[Source, int]], op: str) -> tuple[int, int]:
        kind = a[0]
        if kind == "ptr":
            src, add = where[a[1]]
            return slot_of(src), add
        if kind == "threads":
            assert run.threads is not None, "a native extern asked for threads the run has no slot for"
            return run.threads, 0
        if kind == "int":
            return const(int(a[1])), 0
        raise ValueError(f"native extern {op}: unknown argument {a!r}")

    for step in run.steps:
        first = len(args) // 4
        if step.launch is not None:
            launch = step.launch
            items = [(slot_of(run.bases[n]), 0) for n in launch.buffers]
            items += [(slot_of(Source("size", s)), 0) for s in launch.sizes]
            items += [(slot_of(Source("derived", step.name, i)), 0) for i in range(len(launch.derived))]
            for s, add in items:
                args += [0, s, add, 0]
            steps += [launch.address or 0, len(items), first, int(launch.may_fail)]
            continue
        assert step.extern is not None and step.native is not None
        ext = step.extern
        operands, where = _operands(run, program, ext, values)
        made = step.native.prepare(operands, plan.attrs[ext.name])
        if made is None or len(made) > MAX_ARGS:
            return None

        for a in made:
            if a[0] == "block":
                entries = [item(e, where, ext.node.op) for e in a[1]]
                dst = len(slots)
                slots += [0] * len(entries)
                args += [1, dst, len(ents) // 2, len(entries)]
                for s, add in entries:
                    ents += [s, add]
            else:
                s, add = item(a, where, ext.node.op)
                args += [0, s, add, 0]
        steps += [step.native.address, len(made), first, 1]
    return Tables(run, steps, args, ents, slots)


def _extern_exprs(run: Run, program: TensorProgram) -> list[Any]:
    """The size expressions of the run's extern operands, in :func:`_operands`' order."""
    exprs: list[Any] = []
    for step in run.steps:
        if step.extern is None:
            continue
        for o in step.extern.outputs:
            buf = program.buffers[o]
            exprs += [*buf.shape, *buf.strides]
        for v in step.extern.inputs:
            assert isinstance(v, View)
            exprs += [*v.shape, *v.strides, v.offset]
    return exprs


def _operands(
    run: Run, program: TensorProgram, ext: Extern, values: Iterator[Any]
) -> tuple[list[NativeOperand], list[tuple[Source, int]]]:
    """The extern's operands (outputs, then inputs) for the binding whose size values
    ``values`` yields (:func:`_extern_exprs`' order), and where each one's address comes
    from (a source and a byte offset)."""
    operands: list[NativeOperand] = []
    where: list[tuple[Source, int]] = []

    def ints(n: int) -> tuple[int, ...]:
        return tuple(int(next(values)) for _ in range(n))

    for o in ext.outputs:
        buf = program.buffers[o]
        rank = len(buf.shape)
        operands.append(NativeOperand(buf.dtype.torch, ints(rank), ints(rank)))
        where.append((run.bases[o], 0))
    for v in ext.inputs:
        assert isinstance(v, View)
        dtype = program.buffers[v.buf].dtype.torch
        rank = len(v.shape)
        operands.append(NativeOperand(dtype, ints(rank), ints(rank)))
        where.append((run.bases[v.buf], int(next(values)) * dtype.itemsize))
    return operands, where


def failure(tables: Tables, failed: int, zero_division: Callable[[], None]) -> None:
    """Raise what the failed step (1 + its index in the run) would have raised from Python."""
    step = tables.run.steps[failed - 1]
    rc = int(tables.rc[0])
    if step.launch is not None:
        zero_division()
    if step.native is not None and step.extern is not None and rc != -1:
        raise step.native.error(rc, dict(step.extern.node.attrs))
    raise RuntimeError(f"native run: step {step.name} could not be called (code {rc})")


def kernel_native(launch: Launch, late: bool) -> bool:
    """Whether a kernel step can be in a run: its function's address, integer arguments only
    (no float derived arguments, no scalars), no size computed from data (``late``)."""
    return (
        launch.address is not None
        and not launch.tensors
        and not launch.scalars
        and not late
        and all(t == "int" for _, t in launch.derived)
        and len(launch.buffers) + len(launch.sizes) + len(launch.derived) <= MAX_ARGS
    )


__all__ = [
    "MAX_ARGS",
    "Run",
    "Source",
    "Step",
    "Tables",
    "enabled",
    "failure",
    "kernel_native",
    "make_tables",
    "packer",
]
