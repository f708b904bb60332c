"""Block hashes of a prompt, reusing those of a prefix hashed before.

A chained block hash depends on the seed and every token before it, so the hashes of
the full blocks inside a prompt's cached leading pieces (router/contract/encoding.py:
`prefix_key` names those ids exactly) are the same for every prompt that starts with
them: a long system prompt is hashed once per (seed, block size), and each request
hashes only its blocks after it, continuing the chain from the last reused hash. The
result is exactly `block_hashes(ids, block_size, seed)`.

The memo is an LRU bounded by the number of hashes it holds.
"""

from __future__ import annotations

import collections

from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.protocol import block_hashes_of_bytes


class PrefixHashes:
    def __init__(self, max_hashes: int = 262_144) -> None:
        if max_hashes < 1:
            raise ValueError("prefix hashes: max_hashes must be >= 1")
        self.max_hashes = max_hashes
        self.held = 0
        self.hits = self.misses = 0
        self._memo: collections.OrderedDict[tuple, tuple[int, ...]] = collections.OrderedDict()

    def of(self, enc: Encoding, block_size: int, seed: int) -> list[int]:
        """block_hashes(enc.ids, block_size, seed), in the fewest hash calls."""
        reusable = enc.prefix_tokens // block_size if len(enc.prefix_key) > 1 else 0
        if reusable == 0:
            return block_hashes_of_bytes(enc.data, block_size, seed)
        key = (seed, block_size, enc.prefix_key)
        known = self._memo.get(key)
        if known is None:
            self.misses += 1
            out = block_hashes_of_bytes(enc.data, block_size, seed)
            self._remember(key, tuple(out[:reusable]))
            return out
        self._memo.move_to_end(key)
        self.hits += 1
        rest = block_hashes_of_bytes(enc.data[reusable * block_size * 4:], block_size, seed, parent=known[-1])
        out = list(known)
        out.extend(rest)
        return out

    def _remember(self, key: tuple, hashes: tuple[int, ...]) -> None:
        if len(hashes) > self.max_hashes // 4:
            return
        self._memo[key] = hashes
        self.held += len(hashes)
        while self.held > self.max_hashes:
            _, old = self._memo.popitem(last=False)
            self.held -= len(old)
