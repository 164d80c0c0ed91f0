"""What a backend is, as data: the contract between ``cuvil`` and every target.

A distribution registers a backend with an entry point in the group
``cuvil.backends`` whose name is the target string and whose value is a
:class:`BackendSpec`. Importing the spec must be cheap: heavy imports (a
toolchain, triton, a vendor runtime) happen in ``check`` and ``factory``.

A target declares its pipeline as an ordered list of named :class:`Stage` s (as
Triton's ``BaseBackend.add_stages`` does): Graph IR first, then whatever the
target has (Tensor IR, its own IRs, generated code, binaries). Its executables
carry the text of each stage under the stage's name, so ``cu.audit`` and
``CUVIL_DUMP`` list whatever stages a target declares, and know none by name.
A target that compiles through Tensor IR implements :class:`KernelBackend`
instead of ``compile`` itself and gets the shared program cache, stages, dumps and
program runner (:mod:`cuvil_runtime.pipeline`, :mod:`cuvil_runtime.runner`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import sympy

from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.graph_ir.types import DType

if TYPE_CHECKING:
    from cuvil_ir.tensor_ir.fusion_policy import FusionPolicy
    from cuvil_ir.tensor_ir.program import Kernel, TensorProgram


class TargetError(Exception):
    """A target refusing what it was asked to compile or launch, for a reason it
    states (a rule of its hardware, a limit of its compiler): ``cu.compile`` reports
    the message as the compile error's reason, not as an internal error."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a target can run; the frontend consults this, never the target's name."""

    #: torch device types the target executes on ("cpu", "cuda", "npu")
    devices: frozenset[str] = frozenset({"cpu"})
    #: Graph IR ops with regions (if/for/while) run natively
    control_flow: bool = False
    #: ops with the ``opaque`` trait (extern torch calls) can be run
    extern_calls: bool = True
    #: sizes computed from tensor data (``nonzero``, ``x[mask]``, ``int(t)`` as a size) are
    #: bound when the producing op runs (see [Note: data-dependent sizes] in cuvil_ir)
    data_dependent_sizes: bool = False
    #: kernels can read tensor inputs by strides bound per call (a size argument per
    #: stride): a non-contiguous input (an expand, a transpose) is read where it lies
    #: instead of copied (see [Note: strided inputs] in :mod:`cuvil_runtime.runner`)
    strided_inputs: bool = False
    #: the target's own keyword options of ``cu.compile`` (``cuda_graphs=False``); they
    #: reach ``compile`` in ``CompileOptions.extra``, and any other keyword is an error
    options: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Stage:
    """One named step of a target's pipeline; its text is what the step produced."""

    #: key in ``Executable.stages``, ``cu.audit``'s result and dump file names
    name: str
    #: one line for docs and ``cuvil backends``
    summary: str
    #: file suffix of the stage's text in ``CUVIL_DUMP`` and ``cu.audit(out_dir=)``
    suffix: str = "txt"
    #: the stage produces one text per kernel (also dumped as ``kernels/<kernel>.<suffix>``)
    per_kernel: bool = False


#: the first stage of every target: the captured graph (``Graph.text``)
GRAPH_STAGE = Stage("graph_ir", "the captured Graph IR")
#: the stage after it for targets that compile through Tensor IR
TENSOR_STAGE = Stage("tensor_ir", "fused kernels, extern calls, buffers and the arena plan")
#: the last stage of targets run by :class:`cuvil_runtime.runner.ProgramRunner`
WRAPPER_STAGE = Stage("wrapper", "the generated per-call Python function", suffix="py")


@dataclass(frozen=True, slots=True)
class CompileOptions:
    opt_level: int = 2
    #: extra per-target settings, as sorted (key, value) pairs so options hash
    extra: tuple[tuple[str, Any], ...] = ()


class Executable(Protocol):
    """A compiled graph: graph inputs in order (tensors, Python scalars) → flat outputs.

    ``stages`` maps the name of each stage the target declares (in its order) to the
    text that stage produced for this graph; a stage that produced nothing is absent.
    ``CUVIL_DUMP`` and ``cu.audit`` read only these.
    """

    @property
    def stages(self) -> Mapping[str, str]: ...

    @property
    def kernel_texts(self) -> Mapping[str, Mapping[str, str]]:
        """Kernel name -> the kernel's text at each ``per_kernel`` stage (empty: no kernels)."""
        ...

    def __call__(self, *inputs: Any) -> tuple[Any, ...]: ...


class Target(Protocol):
    name: str
    capabilities: Capabilities

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The pipeline, in order; the first is :data:`GRAPH_STAGE`."""
        ...

    def hash(self) -> str:
        """A digest of everything that changes what ``compile`` produces besides the
        graph and options: the target's code, its compiler, flags and versions."""
        ...

    def compile(self, graph: Graph, options: CompileOptions) -> Executable: ...


@dataclass(frozen=True, slots=True)
class Launch:
    """How the program runner calls one compiled kernel: ``fn(*arguments)`` with, in
    this order, the data pointers of ``buffers`` (the tensors themselves when
    ``tensors``), the int values of ``sizes``, the
    values of ``derived`` (size expressions evaluated once per size binding) and the
    scalar graph values ``scalars``. A kernel with ``may_fail`` returns nonzero when
    an integer division met a zero divisor (the runner raises ``ZeroDivisionError``)."""

    fn: Callable[..., Any]
    buffers: tuple[str, ...]
    sizes: tuple[sympy.Symbol, ...]
    #: (expression, "int" | "float")
    derived: tuple[tuple[sympy.Expr, str], ...] = ()
    #: (graph value name, dtype)
    scalars: tuple[tuple[str, DType], ...] = ()
    may_fail: bool = False
    #: pass the buffers as tensors (arena views, inputs, outputs), not data pointers
    tensors: bool = False
    #: the kernel's C function's address, where it takes only integer-class arguments
    #: (pointers, int64) and a native run may call it ([Note: native runs] in
    #: :mod:`cuvil_runtime.native_runs`); ``None``: called from Python only
    address: int | None = None


#: an argument of a native call (:class:`NativeExtern`): ``("ptr", i)`` the address of
#: operand ``i`` (outputs first, then inputs), ``("int", v)`` a number, ``("threads",)`` the
#: caller's ``torch.get_num_threads()`` at the call, ``("block", (arg, ...))`` the address of
#: an int64 array holding those arguments (no block inside a block)
NativeArg = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class NativeOperand:
    """What :meth:`NativeExtern.prepare` knows of one operand for a size binding."""

    dtype: Any  # torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def is_contiguous(self) -> bool:
        expect = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != expect:
                return False
            expect *= d
        return True


@dataclass(frozen=True)
class NativeExtern:
    """The C form of an extern written into its planned buffer (an out-variant op), for the
    native runs: ``address`` is a C function taking only integer-class arguments and
    returning ``int`` (0: done)."""

    address: int
    #: ``prepare(operands, attrs)``: the call's arguments for one size binding (the operands:
    #: the outputs, then the inputs), or ``None`` where this binding's call must run the
    #: out-variant (operands the C function does not take, sizes its path is not for)
    prepare: Callable[[Sequence[NativeOperand], Mapping[str, Any]], Sequence[NativeArg] | None]
    #: ``error(code, attrs)``: the exception for a nonzero return (the out-variant's own)
    error: Callable[[int, Mapping[str, Any]], Exception]


class ProgramHooks(Protocol):
    """What the program runner and a program's executable need of a backend: shared by
    :class:`KernelBackend` (which compiles) and the loaders of its exported programs
    (which need no compiler)."""

    name: str

    @property
    def stages(self) -> tuple[Stage, ...]:
        """Graph IR → Tensor IR → the backend's ``per_kernel`` stages → wrapper."""
        ...

    @property
    def codec_classes(self) -> tuple[type, ...]:
        """Classes of the objects ``generate`` returns, so the program cache can store
        them (plain dataclasses and enums: see :class:`cuvil_ir.serial.Codec`)."""
        ...

    def kernel_texts(self, code: Any) -> dict[str, str]:
        """The text of each ``per_kernel`` stage for one ``generate`` result."""
        ...

    def extern(self, op: str, reference: Callable[..., Any], channels_last: bool) -> Callable[..., Any]:
        """What an extern call of ``op`` runs (``reference``, or a faster equivalent)."""
        ...

    def out_variant(self, op: str) -> Callable[..., Any]:
        """``fn(out, *inputs, **attrs)`` for an extern lowered to write into its planned
        buffer (the ops in ``fusion_policy(...).out_variants``)."""
        ...


class NativeHooks(Protocol):
    """What a backend adds to :class:`ProgramHooks` for native runs (optional: the runner
    looks the methods up, [Note: native runs] in :mod:`cuvil_runtime.native_runs`)."""

    def step_runner(self) -> Callable[..., int] | None:
        """``run(n, steps, args, ents, slots, rc)``: runs ``n`` steps of the tables (the
        contract of ``cuvil_run_steps`` in the cpu target's ``step_runner.c``), or ``None``
        where this process has none."""
        ...

    def native_extern(self, op: str) -> NativeExtern | None:
        """The C form of the out-variant of ``op``, or ``None``."""
        ...


class KernelBackend(ProgramHooks, Protocol):
    """What a target that compiles through Tensor IR supplies to the shared pipeline
    (:func:`cuvil_runtime.pipeline.compile_program`); everything else (lowering with
    its policy, the program cache, regions, stages, dumps, the per-call runner with
    its arena, extern calls and control flow) is shared."""

    def hash(self) -> str: ...

    def fusion_policy(self, options: CompileOptions) -> FusionPolicy:
        """What lowering may fuse and which ops stay extern calls, for these options."""
        ...

    def generate(self, kernel: Kernel, program: TensorProgram, options: CompileOptions) -> Any:
        """The backend's code for one kernel (plain data, cached with the program)."""
        ...

    def build(self, codes: Sequence[tuple[str, Any]], label: str) -> list[Launch]:
        """Compile and load (kernel name, code) pairs; one :class:`Launch` each, in order."""
        ...


@dataclass(frozen=True, slots=True)
class Exported:
    """One compiled graph as a target writes it into an ahead-of-time artifact
    (``cu.save``, docs/runtime.md): everything its :class:`Loader` needs to run the
    graph again in another process, with no compiler."""

    #: the target's own plain data (JSON, :mod:`cuvil_ir.serial`: never a pickle)
    data: bytes
    #: binaries by file name (``cpu``: one shared object per kernel)
    files: Mapping[str, bytes]
    #: what a host needs to run ``files`` (``cpu``: the ISA and the CPU flags it
    #: needs), checked by :meth:`Loader.check` before anything is loaded
    requires: Mapping[str, Any]


class Exporter(Protocol):
    """A target that can write ahead-of-time artifacts (an optional part of :class:`Target`)."""

    def export(self, graph: Graph, options: CompileOptions) -> Exported: ...


class Loader(Protocol):
    """Runs exported graphs again: made by ``BackendSpec.loader``, which must not need
    the target's compiler (a served model has none)."""

    def check(self, requires: Mapping[str, Any]) -> str | None:
        """Why this host cannot run binaries with these requirements, or ``None``."""
        ...

    def load(self, graph: Graph, exported: Exported) -> Executable:
        """The executable; ``exported.files`` were verified against the artifact's hashes."""
        ...


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """The object a ``cuvil.backends`` entry point resolves to."""

    name: str
    description: str
    #: builds the target; called only when the target is requested
    factory: Callable[[], Target]
    #: returns ``None`` when usable, else why not (e.g. "no C compiler found")
    check: Callable[[], str | None] = field(default=lambda: None)
    #: what to install to get it, e.g. "pip install 'cuvil[cpu]'" (None: built in)
    install: str | None = None
    #: ``target=None`` picks the available target with the highest priority
    priority: int = 0
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: the target's pipeline, in order (the same as its ``Target.stages``)
    stages: tuple[Stage, ...] = (GRAPH_STAGE,)
    #: builds the :class:`Loader` of this target's ahead-of-time artifacts (``None``:
    #: the target writes none); called only by ``cu.load``, and must not need ``check``
    loader: Callable[[], Loader] | None = None
