"""A per-model prefix cache in the manner of vLLM's automatic prefix caching.

The prompt is cut into fixed blocks and each block's hash chains the hash before it, so a
block only matches when everything before it matches too: a nonce at the start of a prompt
defeats the cache, the same prompt sent again hits every full block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16


def block_hashes(tokens: Sequence[str], block_size: int = BLOCK_TOKENS) -> list[int]:
    """Chained hashes of the full blocks of `tokens`; a trailing partial block is never cached."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, tuple(tokens[start : start + block_size])))
        hashes.append(previous)
    return hashes


class PrefixCache:
    """Bounded LRU of block hashes for one model."""

    def __init__(self, *, capacity_blocks: int = 50_000, block_size: int = BLOCK_TOKENS) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, hashes: Sequence[int]) -> int:
        """Tokens served from cache: the leading blocks already present, refreshed as recently used."""
        hits = 0
        for block in hashes:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            hits += 1
        return hits * self.block_size

    def insert(self, hashes: Sequence[int]) -> None:
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
