"""Triton source text under a target's rules, and the live-tile count (no triton needed:
the generator emits text only)."""

from __future__ import annotations

import ast

import pytest

from cuvil_ir.graph_ir.parser import parse_graph
from cuvil_ir.tensor_ir.hoist import must_realize
from cuvil_ir.tensor_ir.lower import FusionPolicy, lower
from cuvil_ir.triton_source.emit import CUDA_RULES, TritonRules, generate_triton
from cuvil_ir.triton_source.tiles import live_tiles


def test_a_value_used_in_a_loop_is_live_for_the_whole_loop():
    source = """
def k(p):
    a = 1
    b = a + 1
    for r in range(4):
        c = b * r
        d = c + 1
    e = 2
    f = e + 1
"""
    # a dies at b; b is read in the loop, so b, c, d overlap across it; e, f after
    assert live_tiles(source, "k", {"a", "b", "c", "d", "e", "f"}) == (3,)
    assert live_tiles(source, "k", {"a", "e", "f"}) == (2,)


def test_the_one_tile_split_counts_each_variant_with_the_shared_head():
    source = """
def k(p, ONE_TILE):
    h = 1
    if ONE_TILE:
        a = h + 1
        b = a + h
    else:
        a = 1
        b = a + 1
        c = b + a
        d = c + b + a + h
"""
    assert live_tiles(source, "k", {"h", "a", "b", "c", "d"}) == (3, 5)
    loop = "def k(p, ONE_TILE):\n    for x in range(3):\n" + "".join(
        "    " + line + "\n" for line in source.split("\n", 2)[2].splitlines()
    )
    ast.parse(loop)
    # a persistent kernel: the variants are inside the loop over blocks
    assert live_tiles(loop, "k", {"h", "a", "b", "c", "d"}) == (3, 5)


SOFTMAX = """graph @softmax(%x: Tensor[f32, (x_0, x_1), cpu]) {
  %0 = softmax(%x) {dim = 1, dtype = none} : Tensor[f32, (x_0, x_1), cpu]
  return %0
}"""

VAR = """graph @var(%x: Tensor[f32, (x_0, x_1), cpu]) {
  %0 = var(%x) {dims = [1], correction = 1, keepdim = false} : Tensor[f32, (x_0,), cpu]
  return %0
}"""


def _one_kernel(text: str):
    program = lower(parse_graph(text), FusionPolicy(realize_reduction=must_realize))
    (kernel,) = program.kernels()
    return kernel, program


def test_rules_change_the_grid_and_nothing_else():
    kernel, program = _one_kernel(SOFTMAX)
    blocks = generate_triton(kernel, program, CUDA_RULES)
    loop = generate_triton(kernel, program, TritonRules(persistent=True))
    assert "tl.program_id(0).to(tl.int64) * XBLOCK" in blocks.source
    assert "tl.num_programs(0)" not in blocks.source
    assert "for xblock in range(tl.program_id(0), tl.cdiv(d0, XBLOCK), tl.num_programs(0)):" in loop.source
    # the same body, one level deeper
    body = [line for line in blocks.source.splitlines() if line.startswith("        ")]
    assert all(("    " + line) in loop.source.splitlines() for line in body)
    assert (blocks.buffers, blocks.derived, blocks.signature) == (loop.buffers, loop.derived, loop.signature)
    assert blocks.tiles == loop.tiles and len(blocks.tiles) == 2 and min(blocks.tiles) >= 2
    for tk in (blocks, loop):
        compile(tk.source, tk.name, "exec")  # valid Python


@pytest.mark.parametrize("welford", [True, False])
def test_welford_can_be_turned_off(welford):
    kernel, program = _one_kernel(VAR)
    tk = generate_triton(kernel, program, TritonRules(welford=welford))
    assert ("cu.welford_combine" in tk.source) == welford
    assert ("tl.float64" in tk.source) == welford  # two passes stay in float32
