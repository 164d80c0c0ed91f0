"""Tensor IR lowering, memory planning and Loop IR scheduling, on graphs written as text.

These pin the fusion decisions the CPU backend's speed rests on (softmax and
layer norm are one kernel with no temporary; pointwise chains fuse; reductions
that would be recomputed are realized), the arena plan (reuse, in place,
``Max`` when sizes are not comparable) and the loop nests (hoisted reductions,
collapsed contiguous loops). Values are checked by the backends' conformance
suites; here only structure is.
"""

from __future__ import annotations

import sympy

from cuvil_backend_cpu.loop_ir import schedule_program
from cuvil_backend_cpu.loop_ir.nodes import Loop
from cuvil_backend_cpu.policy import FUSION
from cuvil_ir import parse_graph, verify
from cuvil_ir.tensor_ir import Extern, Kernel, lower
from cuvil_ir.tensor_ir.lower import FusionPolicy
from cuvil_ir.tensor_ir.values import known_sizes

SOFTMAX = """
graph @f(%x: Tensor[f32, (x_0, x_1), cpu]) {
  %0 = softmax(%x) {dim = 1, dtype = none} : Tensor[f32, (x_0, x_1), cpu]
  return %0
}
"""

LAYER_NORM_GELU = """
graph @g(%x: Tensor[f32, (x_0, x_1, x_2), cpu], %w: Tensor[f32, (x_2,), cpu], %b: Tensor[f32, (x_2,), cpu]) {
  %0 = layer_norm(%x, %w, %b) {eps = 1e-05, has_bias = true, has_weight = true, normalized_shape = [<x_2>]} : Tensor[f32, (x_0, x_1, x_2), cpu]
  %1 = gelu(%0) {approximate = "none"} : Tensor[f32, (x_0, x_1, x_2), cpu]
  return %1
}
"""

COLUMN_SUM = """
graph @h(%x: Tensor[f32, (x_0, x_1), cpu]) {
  %0 = sum(%x) {dims = [0], dtype = none, keepdim = true} : Tensor[f32, (1, x_1), cpu]
  %1 = add(%x, %0) : Tensor[f32, (x_0, x_1), cpu]
  return %1
}
"""

CHAIN = """
graph @c(%x: Tensor[f32, (x_0, x_1), cpu], %w: Tensor[f32, (x_1, x_1), cpu]) {
  %0 = exp(%x) : Tensor[f32, (x_0, x_1), cpu]
  %1 = matmul(%0, %w) : Tensor[f32, (x_0, x_1), cpu]
  %2 = tanh(%1) : Tensor[f32, (x_0, x_1), cpu]
  %3 = matmul(%2, %w) : Tensor[f32, (x_0, x_1), cpu]
  %4 = sigmoid(%3) : Tensor[f32, (x_0, x_1), cpu]
  %5 = matmul(%4, %w) : Tensor[f32, (x_0, x_1), cpu]
  return %5
}
"""

POINTWISE_3D = """
graph @p(%x: Tensor[f32, (x_0, x_1, x_2), cpu], %y: Tensor[f32, (x_0, x_1, x_2), cpu]) {
  %0 = mul(%x, %y) : Tensor[f32, (x_0, x_1, x_2), cpu]
  %1 = relu(%0) : Tensor[f32, (x_0, x_1, x_2), cpu]
  return %1
}
"""


def _lower(text: str, policy=FUSION):
    g = parse_graph(text)
    verify(g)
    return lower(g, policy)


def _loops(stmts) -> list[Loop]:
    out = []
    for s in stmts:
        if isinstance(s, Loop):
            out.append(s)
            out.extend(_loops(s.body))
    return out


def test_softmax_is_one_kernel_with_no_temporary_and_one_parallel_row_loop() -> None:
    p = _lower(SOFTMAX)
    assert [type(s) for s in p.steps] == [Kernel]
    assert p.plan.peak == 0
    [func] = schedule_program(p)
    loops = _loops(func.body)
    assert [lp.kind for lp in loops] == ["par", "vec", "vec", "vec"]
    assert [lp.reduces for lp in loops[1:3]] == [(("acc0", "max"),), (("acc1", "sum"),)]
    # exp(x - max) is computed once: kept in the output by the sum phase, scaled by 1/sum after
    assert func.text.count("exp(") == 1
    assert "reciprocal(acc1)" in func.text


def test_layer_norm_and_gelu_fuse_and_row_loops_collapse() -> None:
    p = _lower(LAYER_NORM_GELU)
    assert len(p.kernels()) == 1 and p.plan.peak == 0
    [func] = schedule_program(p)
    outer = _loops(func.body)[0]
    assert outer.kind == "par"
    assert (
        sympy.expand(
            outer.extent
            - sympy.Symbol("x_0", integer=True, nonnegative=True)
            * sympy.Symbol("x_1", integer=True, nonnegative=True)
        )
        == 0
    )  # rows collapsed
    # mean, then sum of squares around it: two reductions, one each
    assert [lp.reduces for lp in _loops(func.body) if lp.reduces] == [(("acc0", "sum"),), (("acc1", "sum"),)]


def test_a_reduction_the_store_would_recompute_is_realized() -> None:
    p = _lower(COLUMN_SUM)
    kernels = p.kernels()
    assert len(kernels) == 2  # the column sums first, then the broadcast add
    assert p.buffers[kernels[0].buf].kind == "temp"
    assert "sum(" not in str(kernels[1])


def test_pointwise_chain_collapses_to_one_flat_parallel_vector_loop() -> None:
    p = _lower(POINTWISE_3D)
    [func] = schedule_program(p)
    [loop] = _loops(func.body)
    assert loop.kind == "parvec"


def test_arena_reuses_dead_temporaries() -> None:
    p = _lower(CHAIN, FusionPolicy())  # matmuls as plain externs (no out= variants)
    temps = [b for b in p.buffers.values() if b.kind == "temp"]
    assert len(temps) == 3 and sum(1 for s in p.steps if isinstance(s, Extern)) == 3
    assert len(p.plan.slots) == 1  # each temporary is dead before the next is written
    assert p.plan.peak != p.plan.unplanned


def test_sizes_pinned_by_assumptions_are_substituted() -> None:
    x0, x1, y1 = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("x_0", "x_1", "y_1"))
    known = known_sizes((sympy.Eq(x1, 1), sympy.Eq(y1, x0), sympy.Lt(x0, 5)))
    assert known == {x1: 1, y1: x0}


def test_stage_texts_are_deterministic() -> None:
    a, b = _lower(LAYER_NORM_GELU), _lower(LAYER_NORM_GELU)
    assert a.text == b.text and a.hash == b.hash
    fa, fb = schedule_program(a), schedule_program(b)
    assert [f.text for f in fa] == [f.text for f in fb]
