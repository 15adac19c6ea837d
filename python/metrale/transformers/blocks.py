"""The host block tables of one batch over the reference-counted page pool
(metrale.BlockAllocator, the C++ allocator the `metrale` command's serve-sim uses too).

Every layer of a sequence uses the same block ids, so one table serves the cache. Full
blocks are never written again, so sequences that share a history (beam search, repeated
prompts) share them by reference; a shared partial last block is copied for every holder
but one before the next token lands in it (``own_last_blocks``: the allocator's
copy-on-write; the caller copies the pages).
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np

from .._metrale import BlockAllocator


class BlockTables:
    """Block ids (``table``, int32 ``(batch, max_blocks_per_seq)``) and real tokens (``lens``)
    of the sequences of one batch."""

    def __init__(self, num_blocks: int, block_size: int, max_blocks_per_seq: int):
        self.block_size = int(block_size)
        self.max_blocks_per_seq = int(max_blocks_per_seq)
        self.allocator = BlockAllocator(int(num_blocks))
        self._journal = None  # blocks taken since checkpoint()
        self.begin(0)

    def begin(self, batch: int) -> None:
        """A new batch of `batch` empty sequences (their pages, if any, must be freed first)."""
        self.table = np.zeros((batch, self.max_blocks_per_seq), dtype=np.int32)
        self.lens = np.zeros(batch, dtype=np.int64)

    @property
    def batch(self) -> int:
        return len(self.lens)

    def blocks(self, tokens: Any) -> int:
        """The blocks that `tokens` tokens of a sequence fill."""
        return -(-int(tokens) // self.block_size)

    def _take(self) -> int:
        block = self.allocator.allocate()
        if block is None:
            raise RuntimeError(f"metrale PagedCache: out of blocks (num_blocks = {self.allocator.total}); pass a "
                               "larger num_blocks or max_cache_len")
        if self._journal is not None:
            self._journal.append(int(block))
        return int(block)

    def checkpoint(self) -> Tuple[np.ndarray, np.ndarray]:
        """The table and lengths as they are; the blocks taken from now on are recorded, so
        that ``rollback`` can give them back (a forward that fails before it writes). The
        table is kept by reference, not copied: ``grow`` only fills columns past a sequence's
        length, which nothing reads once the length is restored (``begin`` makes new arrays)."""
        self._journal = []
        return self.table, self.lens.copy()

    def commit(self) -> None:
        self._journal = None

    def rollback(self, cp: Tuple[np.ndarray, np.ndarray]) -> None:
        """Back to the checkpoint: the blocks taken since are freed."""
        self.allocator.free_all(self._journal or [])
        self._journal = None
        self.table, self.lens = cp

    def grow(self, b: int, new_len: int) -> List[int]:
        """Gives sequence b the blocks that `new_len` real tokens need; returns the table
        columns filled."""
        cols = list(range(self.blocks(self.lens[b]), self.blocks(new_len)))
        for j in cols:
            self.table[b, j] = self._take()
        return cols

    def held(self, b: int) -> List[int]:
        """The blocks sequence b holds (one reference each)."""
        return [int(x) for x in self.table[b, :self.blocks(self.lens[b])]]

    def free_all(self) -> None:
        """Frees every sequence's blocks and forgets the batch."""
        self.allocator.free_all([x for b in range(self.batch) for x in self.held(b)])
        self.begin(0)

    def crop(self, remove: int) -> None:
        """Removes the last `remove` tokens of every sequence (pages no longer needed go back)."""
        kept = self.lens - remove
        for b in range(self.batch):
            self.allocator.free_all([int(x) for x in self.table[b, self.blocks(kept[b]):self.blocks(self.lens[b])]])
        self.lens = kept

    def remap(self, idx: np.ndarray) -> None:
        """New sequence i continues old sequence idx[i]: the histories kept gain a reference
        per new holder, then every old holder lets go."""
        self.allocator.share_all([x for src in idx for x in self.held(int(src))])
        self.allocator.free_all([x for b in range(self.batch) for x in self.held(b)])
        self.table, self.lens = self.table[idx], self.lens[idx]

    def own_last_blocks(self) -> Tuple[List[int], List[int]]:
        """Copy-on-write of every shared partial last block: the pages to copy, (src, dst)
        (the table already names dst)."""
        src, dst = [], []
        for b in range(self.batch):
            n = int(self.lens[b])
            if n % self.block_size == 0:
                continue
            j = n // self.block_size
            block = int(self.table[b, j])
            fresh = self.allocator.writable(block)
            if fresh is None:
                raise RuntimeError(f"metrale PagedCache: out of blocks (num_blocks = {self.allocator.total}) to "
                                   "copy a shared partial block; pass a larger num_blocks")
            if fresh != block:
                self.table[b, j] = fresh
                src.append(block)
                dst.append(int(fresh))
        return src, dst
