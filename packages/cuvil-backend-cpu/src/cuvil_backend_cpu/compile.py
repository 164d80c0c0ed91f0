"""One compile: lower, plan, schedule, generate C, build (in parallel, cached), wrap.

Every stage's text is kept on the executable (``stages``) and, with
``CUVIL_DUMP=dir``, written to ``dir/<graph hash[:12]>/``: ``graph.txt``,
``tensor_ir.txt``, ``loop_ir.txt``, ``kernels/<name>.c`` and ``wrapper.py``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

from cuvil_backend_cpu.backend import CompileReport, CpuExecutable, dump_dir
from cuvil_backend_cpu.codegen import CKernel, generate_c
from cuvil_backend_cpu.externs import FAST_EXTERNS, OUT_VARIANTS
from cuvil_backend_cpu.kernel_cache import KernelCache
from cuvil_backend_cpu.wrapper import CpuProgram, bind_ctypes
from cuvil_ir.graph_ir.nodes import Graph
from cuvil_ir.loop_ir.schedule import SchedulePolicy, schedule_kernel
from cuvil_ir.serial import Codec, SerialError
from cuvil_ir.tensor_ir.lower import FusionPolicy, lower
from cuvil_ir.tensor_ir.program import Control, Kernel, TensorProgram
from cuvil_runtime.cache import DiskCache
from cuvil_runtime.target import CompileOptions

FUSION = FusionPolicy(
    out_variants=frozenset(OUT_VARIANTS) - frozenset(FAST_EXTERNS),
    # oneDNN runs these about twice as fast on channels-last tensors (measured here)
    channels_last_ops=frozenset({"conv", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool"}),
)


def schedule_policy(options: CompileOptions) -> SchedulePolicy:
    extra = dict(options.extra)
    if options.opt_level <= 0:
        return SchedulePolicy(
            parallel_threshold=1 << 62, collapse=False, vectorize=False, stash=False, tile_size=1
        )
    return SchedulePolicy(parallel_threshold=int(extra.get("parallel_threshold", 32768)))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _generate(
    program: TensorProgram,
    policy: SchedulePolicy,
    simd_math: bool,
    out: dict[str, tuple[TensorProgram, CKernel]],
) -> None:
    """C for every kernel of ``program`` and its regions, keyed by kernel name."""
    slot_of = program.plan.slot_of
    for step in program.steps:
        if isinstance(step, Kernel):
            func = schedule_kernel(step, program, policy)
            reads = {p.name for p in func.buffers if p.name != step.buf}
            in_place = step.buf in slot_of and any(slot_of.get(r) == slot_of[step.buf] for r in reads)
            ck = generate_c(
                func, simd_math=simd_math, parallel_threshold=policy.parallel_threshold, restrict=not in_place
            )
            out[step.name] = (program, ck)
        elif isinstance(step, Control):
            for r in step.regions:
                _generate(r, policy, simd_math, out)


def _wrap(program: TensorProgram, fns: dict[str, tuple[Any, CKernel]]) -> CpuProgram:
    regions = {s.name: [_wrap(r, fns) for r in s.regions] for s in program.steps if isinstance(s, Control)}
    mine = {s.name: fns[s.name] for s in program.steps if isinstance(s, Kernel)}
    return CpuProgram(program, mine, regions)


@functools.cache
def _code_version() -> str:
    """A hash of the compiler's own code (cuvil_ir and this package): a cached program
    is reused only by the code that produced it, whatever the version numbers say."""
    import cuvil_backend_cpu
    import cuvil_ir

    h = hashlib.sha256()
    for pkg in (cuvil_ir, cuvil_backend_cpu):
        root = Path(str(pkg.__file__)).parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _program_key(graph: Graph, options: CompileOptions, cache: KernelCache) -> str:
    parts = [_code_version(), graph.text, repr(options), cache.toolchain.identity]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _lower_and_generate(
    graph: Graph, options: CompileOptions, cache: KernelCache
) -> tuple[TensorProgram, dict[str, tuple[TensorProgram, CKernel]]]:
    """Tensor IR and C for ``graph``: from the program cache on a warm start (the same
    graph text, options, toolchain and backend version), else lowered, scheduled and
    generated, then stored there. The program cache is a :class:`DiskCache` (atomic,
    signed: a damaged or foreign entry is a miss) next to the kernel cache; entries
    are plain data (:mod:`cuvil_ir.serial`), never pickles."""
    store = DiskCache(cache.root.parent / "cpu-programs")
    key = _program_key(graph, options, cache)
    blob = store.get(key)
    if blob is not None:
        try:
            slim, slim_gen = _codec().loads(blob)
            restored: TensorProgram = dc_replace(slim, graph=graph)
            return restored, {k: (restored if o is None else o, ck) for k, (o, ck) in slim_gen.items()}
        except (SerialError, TypeError, ValueError):  # an entry this code cannot read: rebuild it
            pass
    program = lower(graph, FUSION)
    generated: dict[str, tuple[TensorProgram, CKernel]] = {}
    _generate(program, schedule_policy(options), cache.toolchain.simd_math, generated)
    try:
        # the top-level graph is the caller's: stored once, not pickled again
        slim = dc_replace(program, graph=None)  # type: ignore[arg-type]
        slim_gen = {k: (None if owner is program else owner, ck) for k, (owner, ck) in generated.items()}
        store.put(key, _codec().dumps((slim, slim_gen)))
    except (OSError, SerialError):
        pass  # an unwritable entry only costs the next process a re-lowering
    return program, generated


@functools.cache
def _codec() -> Codec:
    return Codec(extra=[CKernel])


def compile_graph(graph: Graph, options: CompileOptions, cache: KernelCache) -> CpuExecutable:
    program, generated = _lower_and_generate(graph, options, cache)
    hits0, misses0 = cache.stats.hits, cache.stats.misses
    names = list(generated)
    paths = cache.build_all([(n, generated[n][1].source) for n in names], label=f"compiling {graph.name}")
    fns = {}
    for n, path in zip(names, paths):
        ck = generated[n][1]
        fns[n] = (bind_ctypes(cache.load(path, ck.source, n), ck), ck)
    runner = _wrap(program, fns)
    loop_text = "\n\n".join(ck.func.text for _, ck in generated.values() if ck.func is not None)
    stages = {
        "graph": graph.text,
        "tensor_ir": program.text,
        "loop_ir": loop_text,
        "c": "\n".join(ck.source for _, ck in generated.values()),
        "wrapper": _wrappers(runner),
    }
    report = CompileReport(
        graph_hash=graph.hash,
        tensor_ir_hash=program.hash,
        loop_ir_hashes={n: ck.func.hash for n, (_, ck) in generated.items() if ck.func is not None},
        c_hashes={n: _sha(ck.source) for n, (_, ck) in generated.items()},
        kernels=len(generated),
        externs=sum(1 for _ in _externs(program)),
        peak_arena_bytes=str(program.plan.peak),
        cache_hits=cache.stats.hits - hits0,
        cache_misses=cache.stats.misses - misses0,
    )
    d = dump_dir()
    if d is not None:
        _dump(d / graph.hash[:12], stages, generated)
    return CpuExecutable(program, runner, stages, report)


def _externs(program: TensorProgram) -> Any:
    from cuvil_ir.tensor_ir.program import Extern

    for s in program.steps:
        if isinstance(s, Extern):
            yield s
        elif isinstance(s, Control):
            for r in s.regions:
                yield from _externs(r)


def _wrappers(p: CpuProgram) -> str:
    parts = [p.source]
    for subs in p.regions.values():
        parts.extend(_wrappers(s) for s in subs)
    return "\n".join(parts)


def _dump(folder: Path, stages: dict[str, str], generated: dict[str, tuple[TensorProgram, CKernel]]) -> None:
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    for name, text in stages.items():
        if name == "c":
            continue
        (folder / f"{name}.{'py' if name == 'wrapper' else 'txt'}").write_text(text)
    for n, (_, ck) in generated.items():
        (folder / "kernels" / f"{n}.c").write_text(ck.source)
