"""What the cpu target generates: golden Loop IR and C, stage dumps, a missing compiler,
and the kernel cache shared across processes.

Regenerate the golden files (after a scheduling or code generation change, reviewing
the diff) with::

    .venv/bin/python -m pytest packages/cuvil-backend-cpu/tests/test_codegen.py -q --update-golden

(``--update-golden`` is registered in the repository root ``conftest.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuvil as cu
from cuvil.testing import golden
from cuvil_backend_cpu.codegen import generate_c
from cuvil_backend_cpu.loop_ir.schedule import SchedulePolicy, schedule_program
from cuvil_backend_cpu.policy import FUSION
from cuvil_backend_cpu.testing import executable_of as executable
from cuvil_ir.tensor_ir.lower import lower
from cuvil_runtime.pipeline import ProgramExecutable

GOLDEN = Path(__file__).parent / "golden"
UPDATE_CMD = "pytest packages/cuvil-backend-cpu/tests/test_codegen.py --update-golden"


def compiled(fn: Callable[..., Any]) -> Any:
    return cu.compile(fn, target="cpu", fallback="error")


def run_script(tmp_path: Path, name: str, source: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env={**os.environ, "CUVIL_PROGRESS": "0", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{err[-3000:]}"
    return out


# -- golden Loop IR and C -------------------------------------------------------------


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def bias_add(x, b):
    return x + b


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


GOLDEN_CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    "softmax_last": (softmax_last, lambda: (torch.randn(2, 8),)),
    "bias_add": (bias_add, lambda: (torch.randn(2, 3, 4), torch.randn(4))),
    "layer_norm": (layer_norm, lambda: (torch.randn(3, 8), torch.randn(8), torch.randn(8))),
}


def generated(name: str) -> tuple[Any, str, str, ProgramExecutable]:
    """(the only Loop IR function, its text, its C, the compiled executable) of a golden case.

    The graph comes from ``cu.compile``; lowering, scheduling and C generation run here
    with fixed settings (default policies, libmvec declarations on), so the texts do not
    depend on the machine's compiler.
    """
    fn, make = GOLDEN_CASES[name]
    cf = compiled(fn)
    args = make()
    torch.testing.assert_close(cf(*args), fn(*args))
    program = lower(cf.graphs[0], FUSION)
    (func,) = schedule_program(program, SchedulePolicy())
    ck = generate_c(func, simd_math=True, parallel_threshold=32768)
    return func, func.text + "\n", ck.source, executable(cf)


def check_golden(path: Path, text: str, update: bool) -> None:
    golden.check_golden(path, text, update=update, update_cmd=UPDATE_CMD)


def loops(func: Any) -> list[Any]:
    from cuvil_backend_cpu.loop_ir.nodes import Loop

    out: list[Any] = []

    def visit(stmts: Any) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                out.append(s)
                visit(s.body)

    visit(func.body)
    return out


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_loop_ir_and_c(name, request):
    func, loop_text, c_text, ex = generated(name)
    update = request.config.getoption("--update-golden", default=False)
    check_golden(GOLDEN / f"{name}.loop.txt", loop_text, update)
    check_golden(GOLDEN / f"{name}.c", c_text, update)
    # the compile pipeline schedules the same way
    assert ex.stages["loop_ir"] == func.text
    assert ex.report.kernels == 1 and ex.report.externs == 0 and ex.program.plan.peak == 0
    assert f"void {func.name}(" in c_text and "/* Loop IR:" in c_text


def test_softmax_schedule_shape():
    func, _, c, _ = generated("softmax_last")
    ls = loops(func)
    assert [lp.kind for lp in ls] == ["par", "vec", "vec", "vec"]  # one par loop, three phases
    assert [r for lp in ls for r in lp.reduces] == [("acc0", "max"), ("acc1", "sum")]
    assert c.count("#pragma omp parallel for") == 1 and c.count("#pragma omp simd") == 3
    assert "reduction(max:acc0)" in c and "reduction(+:acc1)" in c
    # exp(x - max) is stored into the output by the sum phase and read back by the store
    body = c.split(f"void {func.name}(", 1)[1]
    assert body.count("expf(") == 1
    assert "p_b0[(r200 + (i0 * s_x_1))] = s0;" in c


def test_bias_add_collapses_the_batch_dims():
    func, text, c, _ = generated("bias_add")
    ls = loops(func)
    assert [lp.kind for lp in ls] == ["par", "vec"]
    assert str(ls[0].extent) == "x_0*x_1"  # [B, S] collapsed; D stays (the bias walks it alone)
    assert "for (int64_t i1 = 0; i1 < (s_x_0 * s_x_1); ++i1)" in c


def test_layer_norm_is_one_nest():
    func, _, c, _ = generated("layer_norm")
    ls = loops(func)
    assert [lp.kind for lp in ls] == ["par", "vec", "vec", "vec"]
    assert [r for lp in ls for r in lp.reduces] == [("acc0", "sum"), ("acc1", "sum")]
    assert "sqrtf(" in c


def test_no_stale_golden_files():
    names = {f"{n}.loop.txt" for n in GOLDEN_CASES} | {f"{n}.c" for n in GOLDEN_CASES}
    stale = sorted(p.name for p in GOLDEN.iterdir() if p.name not in names)
    assert not stale, f"golden files without a case: {stale}"


# -- CUVIL_DUMP -----------------------------------------------------------------------


def dumped(x, y):
    # constants unique to this test: no other test compiles this graph in-process
    return torch.softmax(x * 1.731 + y, -1), (x - 0.257).exp().sum(0)


def test_cuvil_dump_writes_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_DUMP", str(tmp_path / "dump"))
    cf = compiled(dumped)
    x, y = torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(cf(x, y), dumped(x, y))
    ex = executable(cf)
    (folder,) = (tmp_path / "dump").iterdir()
    assert folder.name == cf.graphs[0].hash[:12] == ex.report.graph_hash[:12]
    files = sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.parent.name != "passes"
    )
    # the IR after every pass, numbered in the order they ran (lowering's only when the
    # program cache did not already hold this graph's Tensor IR)
    passes = sorted(p.name for p in (folder / "passes").iterdir())
    ran = [
        "graph_ir-repeated_heads",
        "graph_ir-decode_attention",
        "graph_ir-attention_pattern",
        "graph_ir-small_matmul",
        "graph_ir-epilogues",
        "graph_ir-shared_input_linears",
        "graph_ir-silu_gate",
    ]
    if not ex.report.program_cache_hit:
        ran += ["graph_ir-specialize", "tensor_ir-lower", "tensor_ir-plan_memory"]
        assert (folder / "passes" / passes[-1]).read_text() == ex.stages["tensor_ir"]
    assert passes == [f"{k:02d}-{name}.txt" for k, name in enumerate(ran, 1)]
    kernels = sorted(f"kernels/{k}.c" for k in ex.report.kernel_hashes["c"])
    loops = sorted(f"kernels/{k}.txt" for k in ex.report.kernel_hashes["loop_ir"])
    assert len(kernels) == len(loops) == ex.report.kernels >= 2
    # one file per stage the target declares, named by the stage
    assert files == sorted(
        ["graph_ir.txt", "tensor_ir.txt", "loop_ir.txt", "c.c", "wrapper.py", *kernels, *loops]
    )
    assert (folder / "graph_ir.txt").read_text() == ex.stages["graph_ir"] == cf.graphs[0].text
    assert (folder / "tensor_ir.txt").read_text() == ex.stages["tensor_ir"]
    assert (folder / "loop_ir.txt").read_text() == ex.stages["loop_ir"]
    assert (folder / "c.c").read_text() == ex.stages["c"]
    assert (folder / "wrapper.py").read_text() == ex.stages["wrapper"]
    for k in kernels:
        text = (folder / k).read_text()
        assert text in ex.stages["c"] and f"void {Path(k).stem}(" in text
    for k in loops:
        assert (folder / k).read_text() in ex.stages["loop_ir"]


# -- a missing compiler ---------------------------------------------------------------

_COMPILE_WITHOUT_CC = """
import torch
import cuvil as cu
try:
    cu.compile(lambda x: x + 1, target="cpu")
except Exception as e:
    print(type(e).__name__)
    print(e)
else:
    print("no error")
"""


def test_missing_compiler_makes_the_target_unavailable(tmp_path):
    env = {"CC": "/nonexistent/cc", "CUVIL_CACHE_DIR": str(tmp_path / "cache")}
    backends = subprocess.Popen(
        [sys.executable, "-m", "cuvil.cli", "backends"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    compile_proc = run_script(tmp_path, "compile_without_cc", _COMPILE_WITHOUT_CC, env)
    listing = finish(backends)
    (cpu_row,) = [line for line in listing.splitlines() if line.startswith("cpu ")]
    assert cpu_row.split()[1] == "no"
    assert "no C compiler found" in cpu_row and "/nonexistent/cc" in cpu_row
    assert any(line.startswith("reference ") and line.split()[1] == "yes" for line in listing.splitlines())

    kind, message = finish(compile_proc).split("\n", 1)
    assert kind == "TargetUnavailableError"
    assert "target 'cpu' is unavailable" in message
    assert "no C compiler found" in message and "CC='/nonexistent/cc'" in message
    # cuvil-backend-cpu is installed: reinstalling it would not help, so it is not suggested
    assert "pip install" not in message


# -- the kernel cache across processes ---------------------------------------------------

_COMPILE_TWICE = """
import json
import torch
import torch.nn.functional as F
import cuvil as cu

def f(x, w, b):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.softmax(h, -1), (h * 3).sum(0), F.gelu(x).amax(-1)

cf = cu.compile(f, target="cpu", fallback="error")
x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
for got, ref in zip(cf(x, w, b), f(x, w, b)):
    torch.testing.assert_close(got, ref)
from cuvil_runtime.registry import get_target
r = cf.artifacts[-1].executable.report
st = get_target("cpu").cache.stats  # this process compiled this one graph
print(json.dumps({"hits": st.hits, "misses": st.misses, "kernels": r.kernels, "c": r.kernel_hashes["c"],
                  "program_cache_hit": r.program_cache_hit,
                  "runner": int(bool(cf.artifacts[-1].executable._runner.runs))}))
"""


def test_kernel_cache_is_reused_by_a_fresh_process(tmp_path):
    env = {"CUVIL_CACHE_DIR": str(tmp_path / "cache")}
    first = json.loads(finish(run_script(tmp_path, "first", _COMPILE_TWICE, env)).splitlines()[-1])
    second = json.loads(finish(run_script(tmp_path, "second", _COMPILE_TWICE, env)).splitlines()[-1])
    assert first["kernels"] == second["kernels"] >= 3
    # (with native runs the step runner is built in the kernel cache too, once)
    built = first["kernels"] + first["runner"]
    assert (first["hits"], first["misses"]) == (0, built)  # an empty cache: all built
    assert (second["hits"], second["misses"]) == (built, 0)  # all reused
    assert first["c"] == second["c"]
    # the second process also skipped lowering and C generation (the program cache)
    assert (first["program_cache_hit"], second["program_cache_hit"]) == (False, True)
    assert len(list((tmp_path / "cache").rglob("*.so"))) == built


def test_a_value_two_externs_read_is_computed_once():
    """A computed value that two extern calls take (a decoder's cache positions, written into
    its key and its value cache) is realized by one kernel, which both read, with eager's
    results."""

    def two_writes(k_cache, v_cache, start, k, v):  # type: ignore[no-untyped-def]
        pos = torch.arange(k.shape[0]) + start  # one elementwise value, two extern consumers
        return k_cache.index_copy(0, pos, k), v_cache.index_copy(0, pos, v)

    f = cu.compile(two_writes, target="cpu", fallback="error")
    args = (torch.zeros(8, 4), torch.zeros(8, 4), torch.tensor(3), torch.randn(2, 4), torch.randn(2, 4))
    for got, want in zip(f(*args), two_writes(*args)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    text = executable(f).program.text
    externs = [line for line in text.splitlines() if "index_copy" in line]
    assert len(externs) == 2, text
    pos = {line.split("(")[1].split(",")[1].strip() for line in externs}  # the position operand
    assert len(pos) == 1, text  # both read one buffer
    assert sum(f"{next(iter(pos))}[" in line for line in text.splitlines() if "kernel" in line) == 1, text
