"""What runs in the next step: a token budget shared by decode steps and prefill chunks,
admission by free blocks, preemption by recompute (docs/serving.md, "Scheduler")."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cuvil_serve.blocks import BlockManager
from cuvil_serve.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    #: (sequence, tokens to compute this step), running ones first
    items: list[tuple[Sequence, int]] = field(default_factory=list)
    #: sequences preempted while this batch was made (their blocks freed)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    """Decode tokens first, then prefill chunks: a step's ``max_tokens_per_step`` budget, of
    which prefill chunks take at most ``max_prefill_while_decoding`` tokens in a step that
    also decodes (a long chunk makes every running sequence's next token wait for it:
    inter-token latency; docs/serving.md, "Scheduler"). ``None``: the whole budget."""

    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_tokens_per_step: int = 128,
        max_seqs: int = 64,
        max_prefill_while_decoding: int | None = None,
    ) -> None:
        if max_tokens_per_step < 1 or max_seqs < 1:
            raise ValueError("the step budget must allow one token of one sequence")
        if max_prefill_while_decoding is not None and max_prefill_while_decoding < 1:
            raise ValueError("max_prefill_while_decoding must be at least 1 (or None: the whole budget)")
        self.blocks = blocks
        self.max_tokens_per_step = max_tokens_per_step
        self.max_seqs = max_seqs
        self.max_prefill_while_decoding = max_prefill_while_decoding
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.table)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.table)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _take(self, batch: ScheduledBatch, seq: Sequence, n: int) -> bool:
        """Blocks for ``n`` more tokens of running ``seq``, preempting the newest running
        sequences while they do not fit; False if ``seq`` itself was preempted."""
        while not self.blocks.can_allocate(seq.table, seq.num_computed + n):
            victim = self.running[-1]
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        self.blocks.allocate(seq.table, seq.num_computed + n)
        batch.items.append((seq, n))
        return True

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_tokens_per_step
        # 1. running sequences' decode tokens, oldest first; the newest is preempted when
        # blocks run out
        for seq in list(self.running):
            if budget <= 0 or len(batch.items) >= self.max_seqs:
                break
            if seq.status is not Status.RUNNING:
                break  # preempted by an older one: so is every newer one
            if seq.num_remaining == 1 and self._take(batch, seq, 1):
                budget -= 1
        # 2. prefill chunks: running sequences' next chunks, then waiting ones, in order
        if batch.items and self.max_prefill_while_decoding is not None:
            budget = min(budget, self.max_prefill_while_decoding)
        for seq in list(self.running):
            if budget <= 0 or len(batch.items) >= self.max_seqs:
                break
            if seq.status is not Status.RUNNING or seq.num_remaining <= 1:
                continue
            # as much of the chunk as the free blocks hold: a chunk never preempts a
            # sequence this batch decodes; only a step that has nothing else preempts
            fits = (self.blocks.num_free + len(seq.table.blocks)) * self.blocks.block_size - seq.num_computed
            n = min(seq.num_remaining, budget, fits)
            if n >= 1:
                self.blocks.allocate(seq.table, seq.num_computed + n)
                batch.items.append((seq, n))
                budget -= n
            elif not batch.items and self._take(batch, seq, min(seq.num_remaining, budget)):
                budget -= batch.items[-1][1]
        while self.waiting and budget > 0 and len(batch.items) < self.max_seqs:
            seq = self.waiting[0]
            if not seq.table.blocks:
                seq.num_computed = self.blocks.share_prefix(seq.table, seq.token_ids)
            n = min(seq.num_remaining, budget)
            if not self.blocks.can_allocate(seq.table, seq.num_computed + n):
                if not self.running and not batch.items and n > 1:
                    # nothing else holds blocks: a smaller first chunk must fit, or nothing ever will
                    n = max(
                        1,
                        (self.blocks.num_free + len(seq.table.blocks)) * self.blocks.block_size
                        - seq.num_computed,
                    )
                    n = min(n, seq.num_remaining, budget)
                if not self.blocks.can_allocate(seq.table, seq.num_computed + n):
                    self.blocks.free(seq.table)  # give back a shared prefix it may not use yet
                    seq.num_computed = 0
                    break
            self.waiting.popleft()
            self.blocks.allocate(seq.table, seq.num_computed + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.items.append((seq, n))
            budget -= n
        # the batch in the running list's order (the step's rows; any order is correct)
        order = {id(seq): i for i, seq in enumerate(self.running)}
        batch.items.sort(key=lambda item: order[id(item[0])])
        return batch


__all__ = ["ScheduledBatch", "Scheduler"]
