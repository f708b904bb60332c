"""Which instances a decision looks at, in work proportional to the request, not the fleet.

The fast path (Dynamo-style): the instances the index says hold the prompt's first block,
those this router sent a request with the same first block within `recent_ttl_s` (their
blocks may not be reported yet; kv_aware credits them as pending), and the `k` with the
fewest requests in flight (the best cold choices). `LeastLoaded` keeps members bucketed by
their in-flight count, each bucket in order of arrival there, so the k least loaded cost
O(k + levels skipped), not a sort; counts change in O(1) as requests start and end.

The router (router/service/routing.py) and the simulator (loadgen/sim/router.py) both pick
candidates through router/decision/route.py: one implementation, so a simulated decision is the router's.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Mapping
from itertools import filterfalse, islice


class LeastLoaded:
    """Members by load level; `least(k)` without sorting."""

    def __init__(self, members: Iterable[Hashable] = (), level_of=None) -> None:
        self._buckets: list[dict[Hashable, None]] = [{}]
        self._level: dict[Hashable, int] = {}
        self._low = 0  # no member is below this level
        for m in members:
            self.add(m, level_of(m) if level_of else 0)

    def __len__(self) -> int:
        return len(self._level)

    def __contains__(self, member: Hashable) -> bool:
        return member in self._level

    def add(self, member: Hashable, level: int = 0) -> None:
        self.discard(member)
        buckets = self._buckets
        while len(buckets) <= level:
            buckets.append({})
        buckets[level][member] = None
        self._level[member] = level
        if level < self._low:
            self._low = level

    def discard(self, member: Hashable) -> None:
        level = self._level.pop(member, None)
        if level is not None:
            del self._buckets[level][member]

    def set(self, member: Hashable, level: int) -> None:
        """`member`'s load is now `level` (no-op for non-members)."""
        if member in self._level:
            self.add(member, max(0, level))

    def least(self, k: int, skip: Mapping | frozenset = frozenset()) -> list:
        out: list = []
        buckets = self._buckets
        levels, level = len(buckets), self._low
        while level < levels and not buckets[level]:
            level += 1
        self._low = level
        left = k
        while level < levels and left > 0:  # each bucket in arrival order, `skip` left out (in C)
            out.extend(islice(filterfalse(skip.__contains__, buckets[level]), left))
            left = k - len(out)
            level += 1
        return out


class RecentSenders:
    """First block -> {instance id: expiry}, for `ttl_s`; expired entries purged in send order."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._table: dict[int, dict[str, float]] = {}
        self._order: collections.deque[tuple[float, int, str]] = collections.deque()

    def __len__(self) -> int:
        return len(self._order)

    def record(self, first_block: int, member: str, now: float) -> None:
        self._purge(now)  # here too: a fleet that never needs match() must not grow the table
        expiry = now + self.ttl_s
        self._table.setdefault(first_block, {})[member] = expiry
        self._order.append((expiry, first_block, member))

    def match(self, first_block: int, now: float) -> Iterable[str]:
        self._purge(now)
        return self._table.get(first_block, ())

    def _purge(self, now: float) -> None:
        order, table = self._order, self._table
        while order and order[0][0] <= now:
            expiry, block, member = order.popleft()
            entry = table.get(block)
            if entry is not None and entry.get(member) == expiry:  # not renewed since
                del entry[member]
                if not entry:
                    del table[block]


def pick(holders: Iterable[Hashable], recent: Iterable[Hashable], least: LeastLoaded, k: int) -> list:
    """Index holders, then recent senders of the first block, then the k least loaded: each once,
    in that order (members only: callers pass holders and senders of the group they route in)."""
    chosen: dict[Hashable, None] = dict.fromkeys(holders)
    chosen.update(dict.fromkeys(recent))
    chosen.update(dict.fromkeys(least.least(k, skip=chosen)))
    return list(chosen)
