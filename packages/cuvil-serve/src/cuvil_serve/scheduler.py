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
    def __init__(self, blocks: BlockManager, *, max_tokens_per_step: int = 128, max_seqs: int = 64) -> None:
        if max_tokens_per_step < 1 or max_seqs < 1:
            raise ValueError("the step budget must allow one token of one sequence")
        self.blocks = blocks
        self.max_tokens_per_step = max_tokens_per_step
        self.max_seqs = max_seqs
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

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_tokens_per_step
        # 1. running sequences, oldest first; the newest is preempted when blocks run out
        i = 0
        while i < len(self.running) and budget > 0 and len(batch.items) < self.max_seqs:
            seq = self.running[i]
            n = min(seq.num_remaining, budget)
            while not self.blocks.can_allocate(seq.table, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break  # seq itself was the newest: everything after it is gone too
            self.blocks.allocate(seq.table, seq.num_computed + n)
            batch.items.append((seq, n))
            budget -= n
            i += 1
        # 2. waiting sequences, in order, while the budget and the free blocks last
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
        return batch


__all__ = ["ScheduledBatch", "Scheduler"]
