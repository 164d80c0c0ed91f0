"""The engine loop in its thread: many concurrent clients each get exactly their own
tokens; leaving a stream early frees its blocks; a full queue is refused."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cuvil_serve.engine import AsyncEngine, QueueFull
from cuvil_serve.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def wait_idle(loop_engine: AsyncEngine) -> None:
    """Until the loop thread has nothing left (aborts are handled between steps)."""
    for _ in range(200):
        if loop_engine.call(lambda e: e.num_unfinished == 0 and not e.has_work()):
            return
        threading.Event().wait(0.02)
    raise AssertionError("the engine still has requests")


def test_many_concurrent_distinct_prompts_get_their_own_tokens(make_engine, tiny, reference):
    """16 threads, each a distinct prompt, submitted together: each stream is exactly that
    prompt's generate() tokens, in order."""
    prompts = [tiny.tokenizer.encode(f"client {i}: " + "x = " * (i % 5) + str(i * 7)) for i in range(16)]
    assert len({tuple(p) for p in prompts}) == 16
    engine = make_engine(num_blocks=48, block_size=8, max_tokens_per_step=40)
    results: dict[int, list[int]] = {i: [] for i in range(16)}
    done = threading.Barrier(17)
    with AsyncEngine(engine) as loop_engine:

        def client(i: int) -> None:
            finished = threading.Event()

            def sink(out):
                results[i].extend(out.new_token_ids)
                if out.finished:
                    finished.set()

            loop_engine.submit(prompts[i], GREEDY, sink)
            assert finished.wait(60)
            done.wait()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        done.wait()
        for t in threads:
            t.join()
        wait_idle(loop_engine)
    for i, p in enumerate(prompts):
        assert results[i] == reference(p, 12), f"client {i}"


def test_async_generate_streams_and_early_exit_aborts(make_engine, prompts, reference):
    engine = make_engine(num_blocks=32, block_size=4)

    async def main(loop_engine):
        tokens = []
        async for out in loop_engine.generate(prompts[3], GREEDY):
            tokens.extend(out.new_token_ids)
        assert tokens == reference(prompts[3], 12)
        # leave after two outputs: the request is aborted and its blocks come back
        n = 0
        async for _ in loop_engine.generate(
            prompts[4], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
        ):
            n += 1
            if n == 2:
                break

    with AsyncEngine(engine) as loop_engine:
        asyncio.run(main(loop_engine))
        wait_idle(loop_engine)
        assert loop_engine.call(lambda e: e.finished["abort"]) == 1


def test_full_queue_is_refused(make_engine, prompts):
    engine = make_engine(max_seqs=1, max_waiting=1)
    loop_engine = AsyncEngine(engine).start()
    try:
        gate = threading.Event()
        loop_engine.call(lambda e: None)
        # hold the loop thread so nothing finishes while we fill the queue
        loop_engine._commands.put(("call", lambda e: gate.wait(10)))
        loop_engine.submit(prompts[0], GREEDY, lambda out: None)
        loop_engine.submit(prompts[1], GREEDY, lambda out: None)
        with pytest.raises(QueueFull):
            loop_engine.submit(prompts[2], GREEDY, lambda out: None)
        gate.set()
        wait_idle(loop_engine)
    finally:
        loop_engine.stop()
