"""The program corpus end to end: compile, run every shape variant, compare with eager.

For every program in :mod:`cuvil.testing.corpus`, the backend
conformance check of :mod:`cuvil.testing.conformance`, on the
``reference`` target whatever else is installed (this tests the frontend; each
backend package runs the same check on its own target): a fresh compile per
test, ``fallback="error"``, each shape variant's result equals eager PyTorch
(values within the program's tolerance, same dtypes, same output structure), no
call falls back, and at most one compile happens per variant. The first
captured graph verifies, survives print -> parse -> print (with and without
source locations), and its canonical text matches a golden file in
``tests/golden/<program>.txt``.

Regenerate the golden files (after an op declaration or the printer changes,
review the diff before committing)::

    .venv/bin/python -m pytest packages/cuvil-core/tests/test_corpus.py -q -p no:logging --update-golden

(``--update-golden`` is registered in the repository root ``conftest.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import cuvil as cu
import cuvil_ir
from cuvil.testing import PROGRAMS, Program, golden
from cuvil.testing.conformance import compile_and_check, conformance_params

GOLDEN = Path(__file__).parent / "golden"
UPDATE_CMD = "pytest packages/cuvil-core/tests/test_corpus.py --update-golden"

# Known Cuvil bugs, each described with a minimal repro.
#: program name -> reason, for programs a known Cuvil bug keeps from compiling.
#: Strict, and only for CompileError: once the bug is fixed the test fails (an
#: unexpected pass, or the missing golden file) until the entry goes.
XFAIL: dict[str, str] = {}


def check_golden(graph: cuvil_ir.Graph, name: str, update: bool) -> None:
    golden.check_golden(GOLDEN / f"{name}.txt", graph.text, update=update, update_cmd=UPDATE_CMD)


@pytest.mark.parametrize("program", conformance_params(XFAIL, raises=cu.CompileError))
def test_program(program: Program, request: pytest.FixtureRequest, record_property: Any) -> None:
    compiled = compile_and_check(program, "reference")
    record_property("compiles", compiled.stats.compiles)

    graph = compiled.graphs[0]
    cuvil_ir.verify(graph)
    with_locs = str(graph)
    reparsed = cuvil_ir.parse_graph(with_locs)
    assert str(reparsed) == with_locs
    cuvil_ir.verify(reparsed)
    canonical = graph.text
    assert cuvil_ir.parse_graph(canonical).text == canonical
    assert reparsed.text == canonical and reparsed.hash == graph.hash
    check_golden(graph, program.name, request.config.getoption("--update-golden", default=False))


def test_corpus_shape():
    names = [p.name for p in PROGRAMS]
    assert len(names) == len(set(names))
    assert sum(not p.is_module for p in PROGRAMS) >= 44
    assert sum(p.is_module for p in PROGRAMS) >= 8
    for p in PROGRAMS:
        shapes = []
        for i in range(p.num_variants):
            args, kwargs = p.call_args(i)
            leaves = pytree.tree_leaves((args, kwargs))
            shapes.append(tuple(tuple(x.shape) for x in leaves if isinstance(x, torch.Tensor)))
        assert len(set(shapes)) == p.num_variants, f"{p.name}: shape variants must differ in size"
        a, b = p.call_args(0), p.call_args(0)
        for x, y in zip(pytree.tree_leaves(a), pytree.tree_leaves(b)):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y), f"{p.name}: inputs are not deterministic"


def test_no_stale_golden_files():
    names = {p.name for p in PROGRAMS}
    stale = sorted(f.name for f in GOLDEN.glob("*.txt") if f.stem not in names)
    assert not stale, f"golden files without a corpus program: {stale}"


def test_corpus_programs_are_captured_as_user_code():
    from cuvil.testing import get_program

    p = get_program("helper_chain")
    compiled = cu.compile(p.fn, fallback="error")
    args, kwargs = p.call_args(0)
    compiled(*args, **kwargs)
    assert "/testing/corpus/" in str(compiled.graphs[0])  # locations point into the corpus source
