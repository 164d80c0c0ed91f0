"""Fixtures of the serving tests: one tiny model per session, engines that must give back
every block (the free-block count returns to its start after every test)."""

from __future__ import annotations

import functools

import pytest
import torch

from cuvil_serve.engine import Engine, EngineConfig
from cuvil_serve.models import LoadedModel, build_model

#: prompts of different lengths (tokens with <s>: 2, 6, 13, 25, 40-ish)
TEXTS = [
    "x",
    "def f(x):",
    "import os\nimport sys\n\nclass Foo:",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'even')\n    else:",
    "The standard library of Python holds modules for files, text, numbers, dates, "
    "networking and much more; this prompt is long enough to span several blocks.",
]


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return build_model("tiny-llama", seed=0)


@pytest.fixture(scope="session")
def prompts(tiny: LoadedModel) -> list[list[int]]:
    return [tiny.tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="session")
def reference(tiny: LoadedModel):
    """``reference(prompt_ids, max_new_tokens)``: transformers' greedy ``generate()`` on that
    prompt alone (eager, float32), the new tokens (ending at ``</s>`` if it came)."""

    @functools.cache
    def ref(prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = tiny.model.generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, attention_mask=None
            )
        return out[0, len(prompt) :].tolist()

    return lambda prompt, n: ref(tuple(prompt), n)


@pytest.fixture
def make_engine(tiny: LoadedModel):
    """``make_engine(**EngineConfig fields)``; after the test, each engine's free-block
    count must be back to its start."""
    engines: list[Engine] = []

    def make(**kwargs) -> Engine:
        engine = Engine(tiny, EngineConfig(**kwargs))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        assert engine.blocks.num_free == engine.blocks.num_blocks, engine.metrics()
        assert all(r == 0 for r in engine.blocks.refcount), "a block is still held"
