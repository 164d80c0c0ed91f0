"""The block manager and the scheduler alone: refcounts, the prefix hash chain, the token
budget, admission and preemption."""

from __future__ import annotations

import pytest

from cuvil_serve.blocks import BlockManager, BlockTable
from cuvil_serve.sampling import SamplingParams
from cuvil_serve.scheduler import Scheduler
from cuvil_serve.sequence import Sequence, Status


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingParams(temperature=0), lambda out: None)


def test_allocate_free_and_refcounts():
    bm = BlockManager(8, 4)
    t = BlockTable()
    bm.allocate(t, 9)  # 3 blocks
    assert len(t.blocks) == 3 and bm.num_free == 5
    bm.allocate(t, 12)  # still 3
    assert len(t.blocks) == 3
    assert not bm.can_allocate(t, 40)
    bm.free(t)
    assert bm.num_free == 8 and all(r == 0 for r in bm.refcount)


def test_prefix_chain_shares_only_equal_prefixes():
    bm = BlockManager(16, 4)
    a = BlockTable()
    tokens = list(range(1, 14))  # 13 tokens: 3 full blocks
    bm.allocate(a, 13)
    bm.register_computed(a, tokens, 13)
    assert len(a.hashes) == 3
    b = BlockTable()
    assert bm.share_prefix(b, tokens) == 12  # all three full blocks (the last token stays)
    assert b.blocks == a.blocks[:3] and all(bm.refcount[x] == 2 for x in b.blocks)
    # the same second block after another first block: the chain says no
    c = BlockTable()
    assert bm.share_prefix(c, [99, 2, 3, 4, *tokens[4:]]) == 0
    # a prompt of exactly 2 blocks shares only 1: its last token must be computed
    d = BlockTable()
    assert bm.share_prefix(d, tokens[:8]) == 4
    for t in (b, d, a):
        bm.free(t)
    assert bm.num_free == 16
    e = BlockTable()
    assert bm.share_prefix(e, tokens) == 0  # freed blocks leave the table


def test_scheduler_budget_mixes_decode_and_prefill_chunks():
    bm = BlockManager(32, 4)
    s = Scheduler(bm, max_tokens_per_step=8)
    first = seq("a", list(range(1, 6)))
    s.add(first)
    batch = s.schedule()
    assert [(x.request_id, n) for x, n in batch.items] == [("a", 5)]
    first.num_computed = 5
    first.token_ids.append(7)  # decoding now: 1 token a step
    s.add(seq("b", list(range(20))))
    batch = s.schedule()
    assert [(x.request_id, n) for x, n in batch.items] == [("a", 1), ("b", 7)]  # b's first chunk
    for x, _ in list(batch.items):
        s.remove(x)
    assert bm.num_free == 32


def test_preemption_frees_the_newest_and_requeues_it_first():
    bm = BlockManager(4, 4)  # 16 slots
    s = Scheduler(bm, max_tokens_per_step=64)
    old, new = seq("old", list(range(1, 8))), seq("new", list(range(1, 8)))
    s.add(old)
    s.add(new)
    s.schedule()  # both admitted: 2 blocks each
    assert bm.num_free == 0
    for x in (old, new):
        x.num_computed = 7
        x.token_ids += [5, 6]  # pretend two tokens were generated: each needs a third block
        x.num_computed = 8
    batch = s.schedule()
    assert batch.preempted == [new] and new.status is Status.WAITING and new.num_computed == 0
    assert s.waiting[0] is new
    assert [x.request_id for x, _ in batch.items] == ["old"]
    s.remove(old)
    s.remove(new)
    assert bm.num_free == 4


def test_prefill_chunks_are_capped_while_sequences_decode():
    bm = BlockManager(64, 4)
    s = Scheduler(bm, max_tokens_per_step=16, max_prefill_while_decoding=3)
    a = seq("a", list(range(1, 6)))
    s.add(a)
    assert [(x.request_id, n) for x, n in s.schedule().items] == [("a", 5)]
    a.num_computed = 5
    a.token_ids.append(7)
    b = seq("b", list(range(30)))
    s.add(b)
    batch = s.schedule()
    assert [(x.request_id, n) for x, n in batch.items] == [("a", 1), ("b", 3)]  # the cap, not 15
    b.num_computed = 3
    s.remove(a)  # nothing decodes: the whole budget again
    assert [(x.request_id, n) for x, n in s.schedule().items] == [("b", 16)]
    s.remove(b)
    assert bm.num_free == 64
    with pytest.raises(ValueError, match="max_prefill_while_decoding"):
        Scheduler(bm, max_prefill_while_decoding=0)


def test_decodes_go_first_and_a_chunk_never_preempts_them():
    """An older sequence still prefilling and a newer one decoding: the decode token is
    scheduled first, and the chunk takes only what the free blocks hold (it used to preempt
    the newest sequence, which this batch had just scheduled)."""
    bm = BlockManager(6, 4)  # 24 slots
    s = Scheduler(bm, max_tokens_per_step=64)
    old, new = seq("old", list(range(1, 21))), seq("new", list(range(1, 5)))
    bm.allocate(old.table, 8)  # old has computed 8 of its 20 prompt tokens (2 blocks)
    old.num_computed, old.status = 8, Status.RUNNING
    bm.allocate(new.table, 4)  # new has computed its 4 prompt tokens (1 block) ...
    new.token_ids.append(9)  # ... and decodes its 5th: a second block
    new.num_computed, new.status = 4, Status.RUNNING
    s.running = [old, new]
    batch = s.schedule()
    # new's token first (1 block), then old's chunk in the 2 blocks left: 8 of its 12 tokens
    assert [(x.request_id, n) for x, n in batch.items] == [("old", 8), ("new", 1)]
    assert not batch.preempted and s.num_preemptions == 0
    assert bm.num_free == 0
    for x in (old, new):
        s.remove(x)
    assert bm.num_free == 6
