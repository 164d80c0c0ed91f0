"""The block manager: which cache blocks are free, who holds each (refcounts), and the
prefix hash chain that lets sequences share identical full prompt blocks
(docs/serving.md, "Block manager").

[Note: the prefix hash chain]
A full block's hash is ``hash((parent_hash, its block_size token ids))``, the parent
being the block before it in its sequence (``None`` for the first). So a hash stands for
the whole prefix up to the block's end, and two blocks with equal hashes hold equal keys
and values (the model is causal: a position's keys depend on the tokens before it only).
A block is entered in the table once its keys and values are computed, never before, and
leaves it when its refcount reaches 0. Shared blocks are full and lie below every
position their sharers write, so they are never written again: sharing needs no copy.
Python's ``hash`` of a tuple of ints is deterministic within a process (no string
hashing is involved), which is all the table needs; a collision is resolved by comparing
the stored tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Entry:
    block: int
    tokens: tuple[int, ...]
    parent: int | None


@dataclass
class BlockTable:
    """One sequence's blocks and how many of them are registered in the prefix table."""

    blocks: list[int] = field(default_factory=list)
    #: hashes of the first ``len(hashes)`` blocks (full, computed, in the table)
    hashes: list[int] = field(default_factory=list)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_sharing: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one slot, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_sharing = prefix_sharing
        self._free: deque[int] = deque(range(num_blocks))
        self.refcount = [0] * num_blocks
        self._by_hash: dict[int, _Entry] = {}
        self._hash_of: dict[int, int] = {}  # block -> its hash, while in the table
        #: blocks given by sharing instead of allocation, since the start (a metric)
        self.shared_hits = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, table: BlockTable, num_tokens_after: int) -> int:
        """How many more blocks ``table`` needs to hold ``num_tokens_after`` tokens."""
        need = -(-num_tokens_after // self.block_size)
        return max(0, need - len(table.blocks))

    def can_allocate(self, table: BlockTable, num_tokens_after: int) -> bool:
        return self.blocks_needed(table, num_tokens_after) <= len(self._free)

    def allocate(self, table: BlockTable, num_tokens_after: int) -> None:
        """Grow ``table`` to hold ``num_tokens_after`` tokens; the caller checked
        :meth:`can_allocate`."""
        n = self.blocks_needed(table, num_tokens_after)
        if n > len(self._free):
            raise RuntimeError(f"{n} blocks needed, {len(self._free)} free")
        for _ in range(n):
            block = self._free.popleft()
            self.refcount[block] = 1
            table.blocks.append(block)

    def free(self, table: BlockTable) -> None:
        """Release every block of ``table`` (shared ones stay while another holds them)."""
        for block in reversed(table.blocks):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                h = self._hash_of.pop(block, None)
                if h is not None:
                    del self._by_hash[h]
                self._free.append(block)
            elif self.refcount[block] < 0:
                raise RuntimeError(f"block {block} freed more often than held")
        table.blocks.clear()
        table.hashes.clear()

    # -- prefix sharing ([Note: the prefix hash chain]) ------------------------------------

    def share_prefix(self, table: BlockTable, token_ids: list[int]) -> int:
        """For an empty ``table``: take every block of the longest registered prefix of
        ``token_ids``, leaving at least the last token to compute. Returns the number of
        tokens those blocks hold (the sequence's computed count)."""
        if table.blocks:
            raise RuntimeError("share_prefix on a sequence that holds blocks")
        if not self.prefix_sharing:
            return 0
        bs = self.block_size
        parent: int | None = None
        for i in range((len(token_ids) - 1) // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = hash((parent, tokens))
            entry = self._by_hash.get(h)
            if entry is None or entry.tokens != tokens or entry.parent != parent:
                break
            self.refcount[entry.block] += 1
            table.blocks.append(entry.block)
            table.hashes.append(h)
            self.shared_hits += 1
            parent = h
        return len(table.blocks) * bs

    def register_computed(self, table: BlockTable, token_ids: list[int], num_computed: int) -> None:
        """Enter the full blocks of ``table`` whose tokens are all computed now."""
        if not self.prefix_sharing:
            return
        bs = self.block_size
        while len(table.hashes) < min(num_computed // bs, len(table.blocks)):
            i = len(table.hashes)
            parent = table.hashes[-1] if table.hashes else None
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = hash((parent, tokens))
            block = table.blocks[i]
            if h not in self._by_hash and block not in self._hash_of:
                self._by_hash[h] = _Entry(block, tokens, parent)
                self._hash_of[block] = h
            table.hashes.append(h)


__all__ = ["BlockManager", "BlockTable"]
