"""transformers' ``generate()`` compiles as users call it: no registration step, the
default dynamic cache and ``cache_implementation="static"``, through ``cu.compile(model)``
and ``model.forward = cu.compile(model.forward)``; greedy tokens equal eager's, a
bounded number of compiles, no fallback (``fallback="error"``). Small Llama-family
models from configs with random weights; ``transformers`` is a test dependency only.
The whole matrix (architectures x caches x decoding modes) is ``test_generate_matrix``
in the slow session."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import cuvil as cu
from cuvil_ir.graph_ir.registry import REGISTRY

T = pytest.importorskip("transformers")


def _available(name: str) -> bool:
    from cuvil_runtime.registry import discover

    return any(i.name == name and i.available for i in discover())


TARGETS = ["reference", pytest.param("cpu", marks=pytest.mark.skipif(not _available("cpu"), reason="no cpu"))]


def _llama(max_positions: int = 128) -> Any:
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    return T.LlamaForCausalLM(cfg).eval()


@pytest.fixture(autouse=True)
def _no_registration() -> Any:
    """As transformers leaves its caches: not pytree nodes (another test may register)."""
    from transformers.cache_utils import DynamicCache

    was = DynamicCache in pytree.SUPPORTED_NODES
    if was:
        pytree._deregister_pytree_node(DynamicCache)
    yield
    if was:
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@torch.no_grad()
def test_generate_on_the_compiled_model_matches_eager(target: str, cache: str) -> None:
    model = _llama()
    kw: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    m = cu.compile(model, target=target, fallback="error")
    ids = torch.randint(0, 96, (2, 5))
    want = model.generate(ids, **kw)
    got = m.generate(ids, **kw)
    assert torch.equal(got, want)
    # the prompt and the step; the caller's model is not changed (eager stays eager)
    assert m.stats.compiles == 2 and m.stats.fallbacks == 0, m.stats.recompile_reasons
    assert m.stats.cache_hits == 4
    assert "forward" not in vars(model)
    assert any("not stored for warm starts: the call passes Python objects" in n for n in m.stats.notes)
    # another generate() of the same shape: no compile; another prompt length
    assert torch.equal(m.generate(ids, **kw), want)
    assert m.stats.compiles == 2, m.stats.recompile_reasons
    # another prompt length: a static cache of another max_cache_len, an int attribute that
    # is a size symbol ([Note: int attributes are sizes]); the model keeps generate()'s
    # bookkeeping (self._cache ...), which its forward never reads ([Note: recorded attribute reads])
    ids = torch.randint(0, 96, (2, 3))
    assert torch.equal(m.generate(ids, **kw), model.generate(ids, **kw))
    assert m.stats.compiles == 2, m.stats.recompile_reasons
    # a batch of one: the same two variants ([Note: torch's general path for sizes])
    ids = torch.randint(0, 96, (1, 4))
    assert torch.equal(m.generate(ids, **kw), model.generate(ids, **kw))
    assert m.stats.compiles == 2, m.stats.recompile_reasons
    assert m.stats.fallbacks == 0


@torch.no_grad()
def test_generate_with_a_compiled_forward_matches_eager() -> None:
    model = _llama()
    ids = torch.randint(0, 96, (1, 6))
    want = model.generate(ids, max_new_tokens=8, do_sample=False)
    forward = model.forward
    model.forward = cu.compile(forward, target="reference", fallback="error")
    try:
        got = model.generate(ids, max_new_tokens=8, do_sample=False)
        again = model.generate(ids, max_new_tokens=8, do_sample=False)
    finally:
        compiled = model.forward
        del model.forward
    assert torch.equal(got, want) and torch.equal(again, want)
    # the compiled function stored on the model is not model state: no recompile per call
    assert compiled.stats.compiles == 2, compiled.stats.recompile_reasons

    assert compiled.stats.fallbacks == 0
    assert forward is not None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@torch.no_grad()
def test_generate_logits_match_eager_at_every_step(target: str, cache: str) -> None:
    model = _llama()
    kw: dict[str, Any] = {
        "max_new_tokens": 10,
        "do_sample": False,
        "return_dict_in_generate": True,
        "output_logits": True,
    }
    if cache == "static":
        kw["cache_implementation"] = "static"
    ids = torch.randint(0, 96, (2, 5))
    want = model.generate(ids, **kw)
    got = cu.compile(model, target=target, fallback="error").generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.logits) == len(want.logits) == 10
    for step, (g, w) in enumerate(zip(got.logits, want.logits)):
        assert g.dtype == w.dtype, step
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.mark.parametrize("how", ["forward", "module"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@torch.no_grad()
def test_generate_with_a_forward_compiled_by_torch_compile_and_cuvil(cache: str, how: str) -> None:
    """``model.forward = torch.compile(model.forward, backend="cuvil", dynamic=True)`` and
    ``model.compile(backend="cuvil", dynamic=True)``: Dynamo captures each step, Cuvil
    compiles its graphs; tokens equal eager's, no fallback, and another prompt length
    compiles nothing new on either side (the static cache's ``max_cache_len`` reaches
    Cuvil as a symbolic int: a size there too)."""
    import torch._dynamo

    from cuvil.fx_backend import compiled_graphs

    torch._dynamo.reset()
    model = _llama()
    kw: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    ids = torch.randint(0, 96, (2, 5))
    want = model.generate(ids, **kw)
    options = {"target": "reference", "fallback": "error"}
    before = len(compiled_graphs())
    if how == "forward":
        model.forward = torch.compile(model.forward, backend="cuvil", dynamic=True, options=options)
    else:
        model.compile(backend="cuvil", dynamic=True, options=options)
    try:
        assert torch.equal(model.generate(ids, **kw), want)
        graphs = compiled_graphs()
        assert len(graphs) > before  # compiled: Cuvil saw the steps
        counts = [g.stats.compiles for g in graphs]
        ids = torch.randint(0, 96, (2, 7))
        got = model.generate(ids, **kw)
    finally:
        if how == "forward":
            del model.forward
        else:
            model._compiled_call_impl = None
    assert torch.equal(got, model.generate(ids, **kw))
    assert len(compiled_graphs()) == len(graphs) and [g.stats.compiles for g in graphs] == counts
    assert all(g.stats.fallbacks == 0 for g in graphs)
    torch._dynamo.reset()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # a size predicate, as transformers' `q_len > 1 and mask is None and ...` yields when
    # the first operand is false (Python's `and` returns that operand itself)
    is_causal = q.shape[2] > 1
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("target", TARGETS)
def test_a_size_predicate_passed_as_is_causal_is_decided(target: str) -> None:
    """[Note: a SymBool where a builtin takes a bool]: one variant per answer, each exact."""
    f = cu.compile(_attention, target=target, fallback="error")
    for q_len in (1, 4, 1, 6):
        q, k = torch.randn(1, 2, q_len, 8), torch.randn(1, 2, 6, 8)
        torch.testing.assert_close(f(q, k, k), _attention(q, k, k), rtol=1e-5, atol=1e-5)
    assert f.stats.compiles == 2, f.stats.recompile_reasons
    assert "is a size predicate" in f.stats.recompile_reasons[0]
    # the builtin is torch's own again, and still the sdpa op's
    assert "__cuvil_wrapped__" not in getattr(F.scaled_dot_product_attention, "__dict__", {})
    found = REGISTRY.for_torch(F.scaled_dot_product_attention)
    assert found is not None and found[0].name == "sdpa"


def _architectures() -> dict[str, Any]:
    common = {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 160,
    }
    return {
        # learned positions
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=160)
        ),
        # rotary, grouped-query attention, RMSNorm
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**common)),
        # attention biases
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**common)),
        # partial rotary
        "phi": lambda: T.PhiForCausalLM(
            T.PhiConfig(
                vocab_size=96,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                partial_rotary_factor=0.5,
                max_position_embeddings=160,
            )
        ),
        # encoder-decoder with a cross-attention cache
        "t5": lambda: T.T5ForConditionalGeneration(
            T.T5Config(
                vocab_size=96,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                decoder_start_token_id=0,
            )
        ),
        # sliding-window attention: its layers count tokens in an int attribute (a size symbol)
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(**common, sliding_window=8)),
    }


_MODES: dict[str, dict[str, Any]] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 20, "top_p": 0.9},
    "beam": {"do_sample": False, "num_beams": 2},
    "left_padding": {"do_sample": False},
}


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", list(_MODES))
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("arch", list(_architectures()))
@torch.no_grad()
def test_generate_matrix(arch: str, cache: str, mode: str, target: str) -> None:
    torch.manual_seed(0)
    model = _architectures()[arch]().eval()
    ids = torch.randint(1, 96, (2, 6))
    kw: dict[str, Any] = {"max_new_tokens": 12, "pad_token_id": 0, **_MODES[mode]}
    if mode == "left_padding":
        mask = torch.ones_like(ids)
        mask[0, :2] = 0
        ids[0, :2] = 0
        kw["attention_mask"] = mask
    if cache == "static":
        kw["cache_implementation"] = "static"
    torch.manual_seed(1)
    want = model.generate(ids, **kw)
    m = cu.compile(model, target=target, fallback="error")
    torch.manual_seed(1)
    got = m.generate(ids, **kw)
    assert torch.equal(got, want)  # sampling too: the same draws under the same seed
    # the prompt and the step; Mistral's sliding window also the step once it is full and,
    # with no attention mask, the steps whose mask transformers skips while the keys are
    # fewer than the window (_ignore_causal_mask_sdpa: `kv_length >= local_attention_size`)
    limit = 2
    if arch == "mistral":
        limit = 3 if mode == "left_padding" or cache == "static" else 4
    assert m.stats.compiles <= limit and m.stats.fallbacks == 0, m.stats.recompile_reasons


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@torch.no_grad()
def test_generate_long_greedy_decoding_matches_eager(target: str) -> None:
    model = _llama(max_positions=300)
    ids = torch.randint(0, 96, (1, 8))
    m = cu.compile(model, target=target, fallback="error")
    for n in (1, 64, 256):
        # min_new_tokens: every one of the n tokens is generated (no early end of sequence)
        got = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        assert got.shape == (1, 8 + n)
        assert torch.equal(got, model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False))
    assert m.stats.compiles == 2 and m.stats.fallbacks == 0


#: (batch, prompt length, new tokens) of the calls, in order: batches of one and more,
#: prompts shorter and longer than Mistral's window (8), new tokens from 1 to 40
_CALLS = ((1, 3, 4), (2, 5, 9), (1, 7, 1), (3, 4, 16), (1, 12, 3), (4, 9, 40), (2, 3, 4))


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("arch", list(_architectures()))
@torch.no_grad()
def test_compiles_are_bounded_across_prompt_lengths_batches_and_new_tokens(
    arch: str, cache: str, target: str
) -> None:
    """Any prompt length, number of new tokens and batch size, eager generate() on the same
    model in between: at most 3 compiles per model and cache kind (2: the prompt and the
    step; Mistral's dynamic sliding window 3: the step once the window is full). Mistral's
    static sliding-window cache is the exception (``_MISTRAL_STATIC``)."""
    torch.manual_seed(0)
    model = _architectures()[arch]().eval()
    m = cu.compile(model, target=target, fallback="error")
    kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0}
    if cache == "static":
        kw["cache_implementation"] = "static"
    for batch, prompt, new in _CALLS:
        ids = torch.randint(1, 96, (batch, prompt))
        mask = torch.ones_like(ids)
        got = m.generate(ids, attention_mask=mask, max_new_tokens=new, **kw)
        assert torch.equal(got, model.generate(ids, attention_mask=mask, max_new_tokens=new, **kw))
    limit = _MISTRAL_STATIC if (arch, cache) == ("mistral", "static") else 3 if arch == "mistral" else 2
    assert m.stats.compiles <= limit and m.stats.fallbacks == 0, m.stats.recompile_reasons


#: transformers' StaticSlidingWindowLayer takes four paths of its own (Python ``if``s in
#: library code on its lengths: a prompt that fits the window or not, a step before the
#: window is full or after) and keeps a flag that changes with the lengths
#: (``_is_croppable = max_cache_len <= sliding_window``, a bool attribute: part of the
#: variant's key), so a process that mixes both sides of each takes six compiles
_MISTRAL_STATIC = 6
