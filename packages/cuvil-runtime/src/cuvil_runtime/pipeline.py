"""The shared compile pipeline of every target that compiles through Tensor IR.

``compile_program(backend, graph, options)`` runs the stages a
:class:`~cuvil_runtime.target.KernelBackend` declares:

1. ``graph_ir``: the captured graph (given);
2. ``tensor_ir``: :func:`cuvil_ir.tensor_ir.lower` with the backend's fusion policy;
3. the backend's ``per_kernel`` stages: ``backend.generate`` for every kernel of the
   program and of its regions (the ``cpu`` target: Loop IR, then C);
4. binaries: ``backend.build`` compiles and loads all kernels at once;
5. ``wrapper``: the :class:`~cuvil_runtime.runner.ProgramRunner` that runs them.

Stages 2 and 3 are a pure function of the graph text, the options and the
backend's ``hash()``, so their result is kept in a program cache
(:class:`~cuvil_runtime.cache.DiskCache`: atomic, signed; a damaged or foreign
entry is a miss) as plain data (:mod:`cuvil_ir.serial`, never pickles): a warm
start skips lowering and code generation. With ``CUVIL_DUMP=dir`` every stage's
text is written out (:mod:`cuvil_runtime.dump`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Protocol

from cuvil_ir.graph_ir.aliases import computed_graph, output_aliases
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.serial import Codec, SerialError
from cuvil_ir.tensor_ir.program import Control, Extern, Kernel, TensorProgram
from cuvil_runtime import gc_pause
from cuvil_runtime.cache import DiskCache
from cuvil_runtime.grad import without_grad
from cuvil_runtime.runner import ProgramRunner, wrappers
from cuvil_runtime.target import CompileOptions, Exported, KernelBackend, Launch, ProgramHooks

#: the bindings of a top-level call (none: its sizes come from its inputs), read-only
_NO_BINDINGS: Any = MappingProxyType({})


@dataclass
class CompileReport:
    """What one compile produced (``ProgramExecutable.report``)."""

    graph_hash: str
    tensor_ir_hash: str
    #: per-kernel stage name -> kernel name -> sha256 of that kernel's text
    kernel_hashes: dict[str, dict[str, str]]
    kernels: int
    externs: int
    peak_arena_bytes: str
    #: the program cache had this graph's Tensor IR and kernel code
    program_cache_hit: bool


class ProgramExecutable:
    """Runs a compiled program; ``stages`` holds the text of every stage in the
    backend's order (for ``cu.audit`` and dumps).

    The texts and the report are made when first asked for: printing a program
    (sympy) costs more than loading it, and a warm start asks for neither."""

    def __init__(
        self,
        graph: Graph,
        program: TensorProgram,
        runner: ProgramRunner,
        backend: ProgramHooks,
        codes: dict[str, Any],
        program_cache_hit: bool,
    ) -> None:
        self.graph = graph
        self.program = program
        self._runner = runner
        self._backend = backend
        self._codes = codes
        self._hit = program_cache_hit
        self._ran = False

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        # inference: results carry no autograd history (kernels could not record one
        # anyway), and out= extern calls refuse parameters that require grad
        if not self._ran:  # the first run makes its size plan and packs weights
            with gc_pause.paused():  # [Note: warm starts pause the collector]
                out = without_grad(self._runner, inputs)
            self._ran = True
            return out
        return without_grad(self._runner, inputs)

    @functools.cached_property
    def call_no_grad(self) -> Callable[..., tuple[Any, ...]]:
        """``self(*inputs)`` for a caller that has turned grad mode off itself: the
        generated wrapper with no bindings, no frame in between (``cuvil.api``'s fast
        path for a cache hit)."""
        return functools.partial(self._runner._run, _NO_BINDINGS)

    @functools.cached_property
    def kernel_texts(self) -> dict[str, dict[str, str]]:
        return {n: self._backend.kernel_texts(code) for n, code in self._codes.items()}

    @functools.cached_property
    def stages(self) -> dict[str, str]:
        stages: dict[str, str] = {}
        for stage in self._backend.stages:
            if stage.name == "graph_ir":
                stages[stage.name] = self.graph.text
            elif stage.name == "tensor_ir":
                stages[stage.name] = self.program.text
            elif stage.name == "wrapper":
                stages[stage.name] = wrappers(self._runner)
            elif stage.per_kernel:
                texts = self._stage_texts(stage.name)
                stages[stage.name] = "\n\n".join(texts.values())
        return stages

    def _stage_texts(self, name: str) -> dict[str, str]:
        return {n: t[name] for n, t in self.kernel_texts.items() if name in t}

    @functools.cached_property
    def report(self) -> CompileReport:
        program = self.program
        return CompileReport(
            graph_hash=self.graph.hash,
            tensor_ir_hash=program.hash,
            kernel_hashes={
                st.name: {n: _sha(t) for n, t in self._stage_texts(st.name).items()}
                for st in self._backend.stages
                if st.per_kernel
            },
            kernels=len(self._codes),
            externs=sum(1 for _ in _externs(program)),
            peak_arena_bytes=str(program.plan.peak),
            program_cache_hit=self._hit,
        )


def package_hash(*packages: ModuleType) -> str:
    """A digest of the Python sources of ``packages``: a cached program is reused only
    by the code that produced it, whatever the version numbers say."""
    return _sha("\n".join(_package_hash(str(Path(str(p.__file__)).parent)) for p in packages))


@functools.cache
def _package_hash(root_name: str) -> str:
    """One package's digest, read once per process however many keys combine it."""
    h = hashlib.sha256()
    root = Path(root_name)
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _externs(program: TensorProgram) -> Iterator[Extern]:
    for step in program.steps:
        if isinstance(step, Extern):
            yield step
        elif isinstance(step, Control):
            for r in step.regions:
                yield from _externs(r)


def _owners(program: TensorProgram, out: dict[str, TensorProgram]) -> dict[str, TensorProgram]:
    """Kernel name -> the program or region it belongs to."""
    for step in program.steps:
        if isinstance(step, Kernel):
            out[step.name] = program
        elif isinstance(step, Control):
            for r in step.regions:
                _owners(r, out)
    return out


@functools.cache
def program_codec(classes: tuple[type, ...]) -> Codec:
    """The program cache's codec: the IR's own classes plus a backend's ``codec_classes``."""
    return Codec(extra=classes)


def generate_all(backend: KernelBackend, program: TensorProgram, options: CompileOptions) -> dict[str, Any]:
    """``backend.generate`` for every kernel of ``program`` and of its regions, by name."""
    owners = _owners(program, {})
    return {k.name: backend.generate(k, owners[k.name], options) for k in program.kernels()}


def _lower_and_generate(
    backend: KernelBackend,
    graph: Graph,
    options: CompileOptions,
    store: DiskCache | None,
    strided_inputs: bool = False,
) -> tuple[TensorProgram, dict[str, Any], bool]:
    """Tensor IR and each kernel's code: from the program cache when it has them
    (``strided_inputs``: the variant that reads its inputs by strides, see [Note:
    strided inputs] in :mod:`cuvil_runtime.runner`)."""
    # only the outputs the program computes: see [Note: output aliasing] in cuvil_ir.graph_ir.aliases
    full, graph = graph, computed_graph(graph, output_aliases(graph))
    codec = program_codec(tuple(backend.codec_classes))
    parts = [backend.hash(), graph.text, repr(options)] + (["strided inputs"] if strided_inputs else [])
    key = _sha("\n".join(parts))
    blob = store.get(key) if store is not None else None
    if blob is not None:
        try:
            slim, codes = codec.loads(blob)
            return dc_replace(slim, graph=full), dict(codes), True
        except (SerialError, TypeError, ValueError):  # an entry this code cannot read: rebuild it
            pass
    from cuvil_ir.tensor_ir.lower import lower  # (not imported by a warm start: it never lowers)

    program = lower(graph, backend.fusion_policy(options), strided_inputs=strided_inputs)
    codes = generate_all(backend, program, options)
    if store is not None:
        try:
            # the top-level graph is the caller's: not stored again
            store.put(key, codec.dumps((dc_replace(program, graph=None), codes)))  # type: ignore[arg-type]
        except (OSError, SerialError):
            pass  # an unwritable entry only costs the next process a re-lowering
    return dc_replace(program, graph=full), codes, False


def compile_program(
    backend: KernelBackend, graph: Graph, options: CompileOptions, cache_dir: Path | None = None
) -> ProgramExecutable:
    """Compile ``graph`` for ``backend`` (see the module doc); ``cache_dir`` holds the
    program cache (``None``: no program cache)."""
    store = DiskCache(cache_dir) if cache_dir is not None else None
    program, codes, hit = _lower_and_generate(backend, graph, options, store)
    names = list(codes)
    launches = backend.build([(n, codes[n]) for n in names], f"compiling {graph.name}")
    strided: Callable[[], ProgramRunner] | None = None
    capabilities = getattr(backend, "capabilities", None)
    if getattr(capabilities, "strided_inputs", False) and any(i.is_tensor for i in program.inputs):
        strided = functools.partial(_strided_runner, backend, graph, options, store)
    return _executable(backend, graph, program, codes, dict(zip(names, launches)), hit, strided)


def _strided_runner(
    backend: KernelBackend, graph: Graph, options: CompileOptions, store: DiskCache | None
) -> ProgramRunner:
    """The runner of ``graph`` whose kernels read the inputs by the call's strides
    (see [Note: strided inputs] in :mod:`cuvil_runtime.runner`)."""
    program, codes, _ = _lower_and_generate(backend, graph, options, store, strided_inputs=True)
    names = list(codes)
    launches = backend.build([(n, codes[n]) for n in names], f"compiling {graph.name} for strided inputs")
    return ProgramRunner(program, dict(zip(names, launches)), backend)


def _executable(
    backend: ProgramHooks,
    graph: Graph,
    program: TensorProgram,
    codes: dict[str, Any],
    launches: dict[str, Launch],
    hit: bool,
    strided: Callable[[], ProgramRunner] | None = None,
) -> ProgramExecutable:
    """The executable of a lowered program whose kernels are loaded (``strided``: see
    :class:`ProgramRunner`)."""
    runner = ProgramRunner(program, launches, backend, strided)
    return ProgramExecutable(graph, program, runner, backend, codes, hit)


# -- ahead-of-time artifacts ------------------------------------------------------------
# [Note: exported programs]
# An exported program is the program cache's entry (the Tensor IR without its graph,
# and each kernel's generated code, as codec JSON) plus one binary per kernel, built
# by the backend for a named ISA rather than this exact CPU. Loading decodes the entry
# (plain data: nothing in it runs), reattaches the artifact's graph, and asks the
# loader for each kernel's Launch from its binary; the runner, stages and report are
# the ones a compile makes, so a loaded program runs exactly as a compiled one.


class ExportingBackend(KernelBackend, Protocol):
    def binaries(self, codes: Sequence[tuple[str, Any]], label: str) -> tuple[list[bytes], dict[str, Any]]:
        """Each kernel's binary for an exported artifact, and what a host needs to run them."""
        ...


class ProgramLoader(ProgramHooks, Protocol):
    def launches(self, kernels: Sequence[tuple[str, Any, bytes]]) -> list[Launch]:
        """A Launch per (kernel name, generated code, binary), loading the binaries."""
        ...


def export_program(
    backend: ExportingBackend, graph: Graph, options: CompileOptions, cache_dir: Path | None = None
) -> Exported:
    """``graph`` compiled by ``backend`` as an :class:`Exported` (see [Note: exported programs]);
    ``cache_dir`` holds the program cache, as for :func:`compile_program`."""
    store = DiskCache(cache_dir) if cache_dir is not None else None
    program, codes, _ = _lower_and_generate(backend, graph, options, store)
    names = list(codes)
    blobs, requires = backend.binaries([(n, codes[n]) for n in names], f"exporting {graph.name}")
    data = program_codec(tuple(backend.codec_classes)).dumps((dc_replace(program, graph=None), codes))  # type: ignore[arg-type]
    return Exported(
        data=data,
        files={f"{n}.bin": b for n, b in zip(names, blobs)},
        requires=requires,
    )


def load_program(loader: ProgramLoader, graph: Graph, exported: Exported) -> ProgramExecutable:
    """The executable of an exported program (see [Note: exported programs])."""
    slim, codes = program_codec(tuple(loader.codec_classes)).loads(exported.data)
    codes = dict(codes)
    program = dc_replace(slim, graph=graph)
    names = list(codes)
    missing = [n for n in names if f"{n}.bin" not in exported.files]
    if missing:
        raise SerialError(f"the artifact has no binary for kernel(s) {missing}")
    launches = loader.launches([(n, codes[n], exported.files[f"{n}.bin"]) for n in names])
    return _executable(loader, graph, program, codes, dict(zip(names, launches)), True)


__all__ = [
    "CompileReport",
    "ExportingBackend",
    "ProgramLoader",
    "export_program",
    "load_program",
    "ProgramExecutable",
    "compile_program",
    "generate_all",
    "package_hash",
    "program_codec",
]
