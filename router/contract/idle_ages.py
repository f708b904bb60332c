"""How long things have been idle, kept as a compact profile of an LRU list.

Shared by the engine (how long its evictable blocks have been idle, for GET /load)
and the router (reuse.py: how long the blocks it has seen have gone unrequested).

The block manager's free cached blocks (cached K/V that no request holds) are
evicted least recently freed first. A router that places a request there needs
to know what that eviction destroys: how many blocks it can take without evicting
anything, and how long the blocks it would evict have gone unused (a block idle
for long is unlikely to be asked for again). Walking the LRU list per report costs
O(pool); this keeps it summarised instead, at O(1) per block freed or taken:

    buckets, oldest first: (start, count, sum of free times)

Blocks are added at the current time (free times never decrease), so a block
belongs to the last bucket whose start is <= its free time. A new bucket opens
when the newest one holds its share (1 / MAX_BUCKETS of the evictable blocks);
beyond MAX_BUCKETS the adjacent pair with the fewest blocks is merged, so the
buckets hold roughly equal numbers of blocks and the profile resolves LRU depth
evenly. `profile(now)` gives (blocks, mean idle seconds) per bucket, oldest first:
the first `blocks[0]` blocks an allocation evicts have been idle about `idle[0]`
seconds, the next `blocks[1]` about `idle[1]`, and so on.
"""

from __future__ import annotations

import bisect
from itertools import islice
from operator import add

MAX_BUCKETS = 16


class IdleAges:
    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        if max_buckets < 2:
            raise ValueError("max_buckets must be at least 2")
        self.max_buckets = max_buckets
        self._starts: list[float] = []
        self._counts: list[int] = []
        self._sums: list[float] = []
        self.total = 0

    def add(self, t: float, n: int = 1) -> None:
        """`n` blocks became evictable at time `t` (never earlier than the previous add)."""
        self.total += n
        counts = self._counts
        if counts and (t <= self._starts[-1] or counts[-1] * self.max_buckets < self.total - n + 1):
            counts[-1] += n
            self._sums[-1] += t * n
            return
        self._starts.append(t)
        counts.append(n)
        self._sums.append(t * n)
        if len(counts) > self.max_buckets:
            self._merge_smallest_pair()

    def remove(self, t: float, n: int = 1) -> None:
        """`n` blocks that became evictable at `t` were taken (prefix hits) or evicted. Blocks added at
        `t` may have joined a bucket that starts earlier: what the bucket at `t` lacks comes from the
        ones before it, as one removal at a time would take it."""
        while n > 0:
            i = bisect.bisect_right(self._starts, t) - 1
            if i < 0:
                raise ValueError(f"no evictable block was added at {t}")
            k = min(n, self._counts[i])
            n -= k
            self.total -= k
            self._counts[i] -= k
            self._sums[i] -= t * k
            if not self._counts[i]:
                if i:  # the range of an empty bucket joins the one before it
                    del self._starts[i], self._counts[i], self._sums[i]
                elif len(self._counts) > 1:
                    del self._starts[1], self._counts[0], self._sums[0]
                else:
                    self.clear()

    def clear(self) -> None:
        self._starts, self._counts, self._sums = [], [], []
        self.total = 0

    def profile(self, now: float) -> tuple[tuple[int, float], ...]:
        """(blocks, mean idle seconds) per bucket, oldest (next evicted) first."""
        return tuple([(n, idle if (idle := now - s / n) >= 0.0 else 0.0)
                      for n, s in zip(self._counts, self._sums) if n])

    def _merge_smallest_pair(self) -> None:
        counts = self._counts
        pairs = list(map(add, counts, islice(counts, 1, None)))
        i = pairs.index(min(pairs))  # the first smallest pair, as min() with a key would pick
        counts[i] += counts[i + 1]
        self._sums[i] += self._sums[i + 1]
        del self._starts[i + 1], counts[i + 1], self._sums[i + 1]
