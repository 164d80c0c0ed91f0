"""MLIR ExecutionEngine vs the reference interpreter, over the program corpus's golden graphs.

Every golden graph whose ops all lower (no external calls) is emitted as upstream MLIR,
lowered with upstream passes, JIT-compiled and run on random inputs whose sizes satisfy
the graph's assumptions; the results must match :class:`cuvil_runtime.executor.Interpreter`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import sympy
import torch

pytest.importorskip("torch_mlir")

import cuvil_ir  # noqa: E402
from cuvil_ir.graph_ir.types import ScalarKind, ScalarType, TensorType  # noqa: E402
from cuvil_ir.mlir import to_mlir  # noqa: E402
from cuvil_ir.mlir.run import compile_mlir  # noqa: E402
from cuvil_ir.symbolic import evaluate_bool  # noqa: E402
from cuvil_ir.testing import CONTROL_FLOW_GRAPHS  # noqa: E402
from cuvil_runtime.executor import Interpreter  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "cuvil-core" / "tests" / "golden"


def _solve_eqs(g: cuvil_ir.Graph, b: dict[sympy.Symbol, int]) -> None:
    """Make the ``Eq`` assumptions hold by solving each for one not yet fixed symbol."""
    fixed: set[sympy.Symbol] = set()
    for _ in range(3):
        for a in g.assumptions:
            if not isinstance(a, sympy.Eq):
                continue
            try:
                if evaluate_bool(a, b):
                    continue
            except ValueError:
                pass
            free = sorted(a.free_symbols - fixed, key=lambda s: s.name)
            for s in free:
                eq = a.xreplace({k: v for k, v in b.items() if k != s})
                try:
                    sols = [v for v in sympy.solve(eq, s) if v.is_Integer and int(v) >= 1]
                except NotImplementedError:
                    sols = []
                if sols:
                    b[s] = int(sols[0])
                    fixed.add(s)
                    break


def choose_sizes(g: cuvil_ir.Graph, seed: int) -> dict[sympy.Symbol, int] | None:
    """Sizes for the graph's symbols that satisfy every assumption (and give non-empty results)."""
    rng = random.Random(seed)
    dims = [
        d
        for n in g.walk()
        for o in n.outputs
        if isinstance(o.type, TensorType)
        for d in o.type.shape
        if not isinstance(d, int) and sympy.sympify(d).free_symbols <= set(g.symbols)
    ]
    for attempt in range(60):
        if attempt % 10 == 9:  # every size equal: meets equalities the assumptions did not record
            b = {s: rng.randint(2, 5) for s in g.symbols[:1]}
            b = {s: next(iter(b.values())) for s in g.symbols}
        else:
            b = {s: rng.randint(2, 5 if attempt < 30 else 9) for s in g.symbols}
        _solve_eqs(g, b)
        try:
            if all(evaluate_bool(a, b) for a in g.assumptions) and all(
                int(sympy.sympify(d).xreplace(b)) >= 1 for d in dims
            ):
                return b
        except (ValueError, TypeError):
            continue
    return None


def make_inputs(g: cuvil_ir.Graph, b: dict[sympy.Symbol, int], seed: int) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for v in g.inputs:
        t = v.type
        if isinstance(t, ScalarType):
            out.append({ScalarKind.int: 3, ScalarKind.float: 0.5, ScalarKind.bool: True}[t.kind])
            continue
        shape = [d if isinstance(d, int) else int(d.xreplace(b)) for d in t.shape]
        if t.dtype.is_floating:
            out.append(torch.randn(shape, generator=gen).to(t.dtype.torch))
        elif t.dtype == cuvil_ir.DType.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            out.append(torch.randint(0, 4, shape, generator=gen).to(t.dtype.torch))
    return out


def _close(a: Any, w: Any) -> bool:
    if isinstance(w, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and a.shape == w.shape
            and a.dtype == w.dtype
            and torch.allclose(a.double(), w.double(), rtol=2e-3, atol=2e-3, equal_nan=True)
        )
    return bool(abs(a - w) <= 1e-6 * max(1.0, abs(w)))


def _lowerable_graphs() -> list[tuple[str, cuvil_ir.Graph]]:
    out = [(f"control_flow/{n}", make()) for n, make in sorted(CONTROL_FLOW_GRAPHS.items())]
    for f in sorted(GOLDEN.glob("*.txt")):
        g = cuvil_ir.parse_graph(f.read_text())
        if to_mlir(g).lowerable:
            out.append((f.stem, g))
    return out


def test_execution_engine_matches_interpreter_on_corpus() -> None:
    ran: list[str] = []
    skipped: dict[str, str] = {}
    failures: list[str] = []
    t0 = time.perf_counter()
    for name, g in _lowerable_graphs():
        expected = None
        for seed in range(4):
            sizes = choose_sizes(g, seed)
            if sizes is None:
                continue
            inputs = make_inputs(g, sizes, seed)
            try:
                expected = Interpreter(g)(*inputs)
            except Exception:  # sizes the (incomplete) assumptions allow but torch rejects
                continue
            break
        if expected is None:
            skipped[name] = "no sizes satisfy the assumptions and run eagerly"
            continue
        got = compile_mlir(g)(*inputs)
        ran.append(name)
        for i, (a, w) in enumerate(zip(got, expected, strict=True)):
            if not _close(a, w):
                failures.append(f"{name}: output #{i} differs (sizes {sizes})")
    print(
        f"\nMLIR oracle: {len(ran)} programs ran and compared, {len(skipped)} skipped {skipped}, "
        f"{time.perf_counter() - t0:.1f}s"
    )
    assert not failures, "\n".join(failures)
    assert len(ran) >= 50
