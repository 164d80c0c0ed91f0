"""Tensor IR: a program of kernels, extern calls and control flow over named buffers.

See docs/tensor-and-loop-ir.md. A :class:`TensorProgram` is what a backend
schedules and generates code for; it prints canonically and hashes like Graph IR.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any, Union

import sympy

from cuvil_ir.graph_ir.nodes import Graph, Node
from cuvil_ir.graph_ir.types import DType
from cuvil_ir.symbolic import Dim, dim_str
from cuvil_ir.symbolic import expr_str as sexpr
from cuvil_ir.tensor_ir.expr import Expr, expr_str

#: buffer kinds: graph inputs, program outputs, arena temporaries, extern-allocated results
BUFFER_KINDS = ("input", "output", "temp", "extern")


@dataclass(frozen=True, slots=True)
class Buffer:
    """An array; ``shape`` dims are ints or size expressions.

    ``order`` is the layout: dimensions from outermost to innermost in memory
    (``None``: row-major, ``(0, 2, 3, 1)``: channels-last for NCHW). ``given``: the
    strides of an input read as the caller laid it out, size symbols the runtime binds
    from the tensor's ``stride()`` on every call (0 for an expanded dim; see [Note:
    strided inputs] in :mod:`cuvil_runtime.runner`); ``None``: the layout of ``order``.
    """

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    kind: str
    order: tuple[int, ...] | None = None
    given: tuple[Dim, ...] | None = None

    @property
    def strides(self) -> tuple[Dim, ...]:
        if self.given is not None:
            return self.given
        return layout_strides(self.shape, self.order)

    @property
    def numel(self) -> sympy.Expr:
        return _numel(self.shape)

    @property
    def nbytes(self) -> sympy.Expr:
        return _nbytes(self.shape, self.dtype)

    def __str__(self) -> str:
        dims = ", ".join(dim_str(d) for d in self.shape)
        layout = "" if self.order is None else " order(" + ", ".join(map(str, self.order)) + ")"
        if self.given is not None:
            layout += " strides(" + ", ".join(dim_str(d) for d in self.given) + ")"
        return f"%{self.name}: {self.dtype.value}[{dims}] {self.kind}{layout}"


@dataclass(frozen=True, slots=True)
class View:
    """A strided view of a buffer handed to an extern call (no copy)."""

    buf: str
    shape: tuple[Dim, ...]
    strides: tuple[Dim, ...]
    offset: Dim

    def __str__(self) -> str:
        if self.offset == 0 and self.strides == contiguous_strides(self.shape):
            return f"%{self.buf}"
        sh = ", ".join(dim_str(d) for d in self.shape)
        st = ", ".join(dim_str(d) for d in self.strides)
        return f"%{self.buf}<[{sh}], [{st}], +{dim_str(self.offset)}>"


@dataclass(frozen=True, slots=True)
class ScalarRef:
    """A scalar operand of an extern call: a program argument or a constant."""

    value: Expr

    def __str__(self) -> str:
        return expr_str(self.value)


Operand = Union[View, ScalarRef]


@dataclass(frozen=True, slots=True)
class Kernel:
    """``buf[i] = body(i)`` for every index ``i`` of ``domain`` (``buf``'s shape)."""

    name: str
    buf: str
    domain: tuple[Dim, ...]
    body: Expr

    def __str__(self) -> str:
        dom = ", ".join(dim_str(d) for d in self.domain)
        idx = ", ".join(f"_i{k}" for k in range(len(self.domain)))
        return f"kernel {self.name} [{dom}] {{ %{self.buf}[{idx}] = {expr_str(self.body)} }}"


@dataclass(frozen=True, slots=True)
class Extern:
    """A Graph IR node run by its op's eager reference; results land in ``outputs``."""

    name: str
    node: Node
    inputs: tuple[Operand, ...]
    outputs: tuple[str, ...]
    #: the backend writes the result into its planned buffer (an ``out=`` variant)
    into: bool = False

    def __str__(self) -> str:
        attrs = ", ".join(f"{k} = {_attr_str(v)}" for k, v in self.node.attrs)
        args = ", ".join(str(o) for o in self.inputs)
        outs = ", ".join(f"%{o}" for o in self.outputs)
        arrow = "into" if self.into else "->"
        return f"extern {self.name} = {self.node.op}({args}) {{{attrs}}} {arrow} {outs}"


@dataclass(frozen=True, slots=True)
class Control:
    """``if``/``for``/``while``: each region lowered to its own program (arguments are
    the region's block arguments, outputs its yields)."""

    name: str
    node: Node
    inputs: tuple[Operand, ...]
    regions: tuple[TensorProgram, ...]
    outputs: tuple[str, ...]

    def __str__(self) -> str:
        args = ", ".join(str(o) for o in self.inputs)
        outs = ", ".join(f"%{o}" for o in self.outputs)
        inner = "\n".join(_indent(str(r)) for r in self.regions)
        return f"control {self.name} = {self.node.op}({args}) -> {outs} (\n{inner}\n)"


Step = Union[Kernel, Extern, Control]


@dataclass(frozen=True, slots=True)
class ProgramInput:
    """Graph input ``index``: a tensor buffer, or a scalar passed as :class:`Arg` ``name``."""

    name: str
    is_tensor: bool


@dataclass(frozen=True)
class TensorProgram:
    name: str
    graph: Graph
    inputs: tuple[ProgramInput, ...]
    buffers: dict[str, Buffer]
    steps: tuple[Step, ...]
    #: per program output: a buffer name, or a scalar expression (a constant or an argument)
    outputs: tuple[str | Expr, ...]
    #: extra size symbols the program's sizes may use beyond the inputs' (a loop index)
    outer_symbols: tuple[sympy.Symbol, ...] = ()
    #: int64 arguments the runtime draws from torch's random generator on every call
    #: (the seeds of ``rand``: train-mode dropout)
    seeds: tuple[str, ...] = ()
    plan: Any = field(default=None, compare=False)  # cuvil_ir.tensor_ir.memory.MemoryPlan
    #: the torch device type the arena, outputs and kernels live on
    device: str = "cpu"

    @property
    def text(self) -> str:
        return print_program(self)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __str__(self) -> str:
        return self.text

    def kernels(self) -> list[Kernel]:
        """Every kernel, those of nested regions included, in program order."""
        out: list[Kernel] = []
        for s in self.steps:
            if isinstance(s, Kernel):
                out.append(s)
            elif isinstance(s, Control):
                for r in s.regions:
                    out.extend(r.kernels())
        return out


# the runner asks these of every buffer for every new size binding (a size plan): made
# once per shape, not once per call ([Note: evaluating a size expression again])
@functools.lru_cache(maxsize=1 << 14)
def _numel(shape: tuple[Dim, ...]) -> sympy.Expr:
    n: Any = sympy.Integer(1)
    for d in shape:
        n = n * d
    return n if _expanded(n) else sympy.expand(n)


@functools.lru_cache(maxsize=1 << 14)
def _nbytes(shape: tuple[Dim, ...], dtype: DType) -> sympy.Expr:
    import torch

    return sympy.expand(_numel(shape) * torch.empty((), dtype=dtype.torch).element_size())


@functools.lru_cache(maxsize=1 << 14)
def layout_strides(shape: tuple[Dim, ...], order: tuple[int, ...] | None) -> tuple[Dim, ...]:
    """Strides of ``shape`` laid out in ``order`` (outermost dim first; None: row-major)."""
    if order is None:
        return contiguous_strides(shape)
    inner = contiguous_strides(tuple(shape[d] for d in order))
    out: list[Dim] = [0] * len(shape)
    for pos, d in enumerate(order):
        out[d] = inner[pos]
    return tuple(out)


#: NCHW tensors stored channels-last (what oneDNN convolutions run fastest on)
CHANNELS_LAST = (0, 2, 3, 1)


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    strides: list[Any] = []
    acc: Any = 1
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d
    return tuple(s if _expanded(s) else sympy.expand(s) for s in reversed(strides))


def _expanded(e: Any) -> bool:
    """``e`` is an int, a symbol or a product of symbols and integers: ``sympy.expand``
    returns it unchanged (and costs ~0.4 ms a call while sympy's caches are cold: most of
    a warm start's first size plan and wrapper)."""
    if isinstance(e, int) or e.is_Symbol or e.is_Integer:
        return True
    return bool(e.is_Mul) and all(a.is_Symbol or a.is_Integer for a in e.args)


def _attr_str(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_attr_str(x) for x in v) + "]"
    if isinstance(v, sympy.Basic):
        return f"<{sexpr(v)}>"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, DType):
        return v.value
    return str(v)


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


def print_program(p: TensorProgram) -> str:
    ins = ", ".join(str(p.buffers[i.name]) if i.is_tensor else f"${i.name}: scalar" for i in p.inputs)
    outs = ", ".join(f"%{o}" if isinstance(o, str) else expr_str(o) for o in p.outputs)
    on = "" if p.device == "cpu" else f" on {p.device}"
    lines = [f"program @{p.name}({ins}) -> ({outs}){on} {{"]
    for seed in p.seeds:
        lines.append(f"  random ${seed}: i64")
    for b in p.buffers.values():
        if b.kind != "input":
            lines.append(f"  buffer {b}")
    for s in p.steps:
        lines.append(_indent(str(s)))
    if p.plan is not None:
        lines.append(_indent(str(p.plan)))
    lines.append("}")
    return "\n".join(lines)
