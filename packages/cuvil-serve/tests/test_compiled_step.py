"""The step compiled by ``cu.compile`` (one call: ``EngineConfig(compile=True)``): the same
tokens as the eager step, and one compile for every batch, token and block count.

Needs the paged ops as Graph IR ops (``paged_attention`` in the registry): skipped,
saying so, on a branch without them."""

from __future__ import annotations

import pytest

from cuvil_ir.graph_ir.registry import REGISTRY
from cuvil_serve.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    "paged_attention" not in REGISTRY, reason="paged_attention is not a Graph IR op on this branch yet"
)


def targets() -> list[str]:
    import cuvil as cu

    available = {b.name for b in cu.backends() if b.available}
    return [t for t in ("reference", "cpu") if t in available]


@pytest.mark.parametrize("target", targets())
def test_compiled_step_equals_eager_and_compiles_once(make_engine, prompts, reference, target):
    params = SamplingParams(max_tokens=8, temperature=0)
    engine = make_engine(num_blocks=40, block_size=4, max_tokens_per_step=16, compile=True, target=target)
    # batch sizes 1..5, prefill chunks and decode steps mixed, block tables of 1..17 blocks
    assert engine.generate([prompts[1]], params) == [reference(prompts[1], 8)]
    assert engine.generate(prompts, params) == [reference(p, 8) for p in prompts]
    assert engine.generate(prompts[2:4], params) == [reference(p, 8) for p in prompts[2:4]]
    stats = engine.compiled.stats
    assert stats.compiles == 1, stats.recompile_reasons
    assert stats.fallbacks == 0, stats.fallback_reasons
    assert stats.cache_hits == engine.steps - 1


@pytest.mark.parametrize("target", [t for t in targets() if t == "cpu"])
def test_compiled_step_under_preemption_and_prefix_sharing(make_engine, prompts, reference, target):
    """Too few blocks (preemption, recompute) and identical prompts (shared blocks) with the
    compiled step: generate()'s tokens, still one compile."""
    params = SamplingParams(max_tokens=24, temperature=0)
    engine = make_engine(num_blocks=24, block_size=4, compile=True, target=target)
    assert engine.generate(prompts, params) == [reference(p, 24) for p in prompts]
    assert engine.scheduler.num_preemptions > 0
    assert engine.generate([prompts[3]] * 3, params) == [reference(prompts[3], 24)] * 3
    assert engine.blocks.shared_hits > 0
    assert engine.compiled.stats.compiles == 1, engine.compiled.stats.recompile_reasons
