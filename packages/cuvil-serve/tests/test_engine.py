"""The engine against transformers' ``generate()``: greedy tokens equal for each prompt
alone, batched, in prefill chunks, under preemption and with shared prefixes; stop
conditions, sampling parameters, cancellation."""

from __future__ import annotations

import pytest
import torch

from cuvil_serve.engine import PromptTooLong
from cuvil_serve.sampling import BadParameter, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0)


def test_each_prompt_alone_equals_generate(make_engine, prompts, reference):
    engine = make_engine(num_blocks=32, block_size=16)
    for p in prompts:
        assert engine.generate([p], GREEDY) == [reference(p, 24)]


@pytest.mark.parametrize("attention", ["sdpa", "op"])
def test_batched_prompts_equal_generate(make_engine, prompts, reference, attention):
    engine = make_engine(num_blocks=64, block_size=16, attention=attention)
    outs = engine.generate(prompts, GREEDY)
    assert outs == [reference(p, 24) for p in prompts]
    assert engine.steps <= 24 + 1  # one batch: every prompt prefilled in the first step


@pytest.mark.parametrize("budget, attention", [(3, "sdpa"), (7, "sdpa"), (7, "op")])
def test_chunked_prefill_equals_generate(make_engine, prompts, reference, budget, attention):
    """A token budget below the prompt lengths: prompts are cut into chunks, mixed with
    other sequences' decode steps in one batch (the eager step with either attention)."""
    engine = make_engine(num_blocks=64, block_size=4, max_tokens_per_step=budget, attention=attention)
    outs = engine.generate(prompts, GREEDY)
    assert outs == [reference(p, 24) for p in prompts]


@pytest.mark.parametrize("attention", ["sdpa", "op"])
def test_preemption_recomputes_and_equals_generate(make_engine, prompts, reference, attention):
    """Too few blocks for all at once: the newest sequences are preempted (blocks freed,
    recomputed later, prompt and output so far) and still give generate()'s tokens."""
    engine = make_engine(num_blocks=24, block_size=4, attention=attention)  # 96 slots; the five need ~220
    outs = engine.generate(prompts, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert outs == [reference(p, 24) for p in prompts]


def test_prefix_sharing_shares_blocks_and_changes_nothing(make_engine, prompts, reference):
    base = prompts[4]  # ~40 tokens: several full blocks of 8
    engine = make_engine(num_blocks=64, block_size=8)
    first = []
    engine.add_request(base, GREEDY, lambda out: first.extend(out.new_token_ids))
    engine.step()  # the prompt is computed: its full blocks enter the table
    held = list(engine.scheduler.running[0].table.blocks)
    free_before = engine.blocks.num_free
    second = []
    engine.add_request(base[:-3] + [5, 6, 7], GREEDY, lambda out: second.extend(out.new_token_ids))
    engine.step()
    other = engine.scheduler.running[1].table.blocks
    shared = [b for b in other if b in held]
    assert len(shared) == (len(base) - 3) // 8  # every full block of the common part
    assert all(engine.blocks.refcount[b] == 2 for b in shared)
    # copy-free: the second sequence allocated only its unshared tail
    assert free_before - engine.blocks.num_free == len(other) - len(shared)
    assert engine.blocks.shared_hits == len(shared)
    while engine.has_work():
        engine.step()
    assert first == reference(base, 24)
    assert second == reference(base[:-3] + [5, 6, 7], 24)


def test_identical_prompts_share_and_agree(make_engine, prompts, reference):
    engine = make_engine(num_blocks=64, block_size=4, max_tokens_per_step=16)
    outs = engine.generate([prompts[3]] * 3, GREEDY)
    assert outs == [reference(prompts[3], 24)] * 3
    assert engine.blocks.shared_hits > 0


def test_stop_token_ids_max_tokens_and_eos(make_engine, prompts, reference):
    engine = make_engine()
    ref = reference(prompts[1], 24)
    stop = ref[5]
    outs = engine.generate([prompts[1]], SamplingParams(max_tokens=24, temperature=0, stop_token_ids=(stop,)))
    assert outs[0] == ref[: ref.index(stop) + 1]
    finished = []
    engine.add_request(prompts[1], SamplingParams(max_tokens=3, temperature=0), finished.append)
    while engine.has_work():
        engine.step()
    assert [t for o in finished for t in o.new_token_ids] == ref[:3]
    assert finished[-1].finish_reason == "length"
    # ignore_eos: the same tokens (none of them is </s> here), to max_tokens
    assert engine.generate([prompts[1]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)) == [
        ref
    ]


def test_stop_strings_cut_text_and_stream_consistently(make_engine, prompts, reference, tiny):
    engine = make_engine()
    ref = reference(prompts[2], 24)
    text = tiny.tokenizer.decode(ref)
    # three characters from the middle on, not blank, that the model writes
    stop = next(text[i : i + 3] for i in range(len(text) // 2, len(text) - 3) if text[i : i + 3].strip())
    outs = []
    engine.add_request(prompts[2], SamplingParams(max_tokens=24, temperature=0, stop=(stop,)), outs.append)
    while engine.has_work():
        engine.step()
    streamed = "".join(o.new_text for o in outs)
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert streamed == text[: text.find(stop)]
    assert stop not in streamed


def test_sampling_seed_is_per_request(make_engine, prompts):
    engine = make_engine(num_blocks=64)
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234)
    alone = engine.generate([prompts[2]], params)[0]
    batched = engine.generate([prompts[0], prompts[2], prompts[3]], [GREEDY, params, params])
    assert batched[1] == alone  # the same seed, the same draws, whatever shares the batch
    other = engine.generate([prompts[2]], SamplingParams(max_tokens=12, temperature=0.8, seed=99))[0]
    assert other != alone


def test_top_k_one_is_greedy(make_engine, prompts, reference):
    engine = make_engine()
    outs = engine.generate([prompts[3]], SamplingParams(max_tokens=24, temperature=1.5, top_k=1, seed=0))
    assert outs[0] == reference(prompts[3], 24)


def test_abort_frees_blocks(make_engine, prompts):
    engine = make_engine(num_blocks=32, block_size=4)
    got = []
    rid = engine.add_request(prompts[4], SamplingParams(max_tokens=50, temperature=0), got.append)
    engine.step()
    engine.step()
    assert engine.blocks.num_free < 32
    assert engine.abort(rid)
    assert engine.blocks.num_free == 32
    assert got[-1].finished and got[-1].finish_reason == "abort"
    assert not engine.abort(rid)


def test_bad_requests_are_refused(make_engine, tiny):
    engine = make_engine(num_blocks=8, block_size=16)  # a context of 128 tokens
    with pytest.raises(PromptTooLong, match="do not fit the context of 128"):
        engine.add_request([1] * 120, SamplingParams(max_tokens=16))
    with pytest.raises(BadParameter, match="token ids"):
        engine.add_request([1, tiny.tokenizer.vocab_size], SamplingParams())
    with pytest.raises(BadParameter, match="empty"):
        engine.add_request([], SamplingParams())
    for bad in (dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(seed="x")):
        with pytest.raises(BadParameter):
            SamplingParams(**bad)


@pytest.mark.parametrize("attention", ["sdpa", "op"])
def test_step_logits_equal_the_model_forward(make_engine, prompts, tiny, attention):
    """One mixed step's logits (two prompts prefilled) against the model's forward on each."""
    from cuvil_serve.step import StepInputs

    engine = make_engine(num_blocks=16, block_size=4, attention=attention)
    for p in prompts[1:3]:
        engine.add_request(p, GREEDY)
    batch = engine.scheduler.schedule()
    inputs = StepInputs.build(batch.items, 4)
    with torch.no_grad():
        logits = engine.paged(*inputs.args(engine.key_caches, engine.value_caches))
        for row, p in enumerate(prompts[1:3]):
            want = tiny.model(torch.tensor([p])).logits[0, -1]
            torch.testing.assert_close(logits[row], want, rtol=1e-4, atol=1e-5)
    for seq, _ in batch.items:
        engine.abort(seq.request_id)
