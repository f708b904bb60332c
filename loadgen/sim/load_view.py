"""The simulated router's view of every instance: `InstanceState`s kept current incrementally.

Router-side load is what the real router's proxy tracks (router/proxy.py): on
dispatch an instance gets +1 inflight and the request's predicted uncached tokens
as queued prefill work, removed at its first token (or its end, if none came).
Engine-side `running`, `waiting` and `kv_usage` are whatever the last load poll
saw (`polled`).

Each change marks the instance dirty; before a decision `flush` rebuilds the
frozen `InstanceState` of the dirty instances only, in a list that is kept (and
handed to the policy) instead of rebuilt: O(changed instances) per decision, not
O(instances).

Fast path (`fast_k > 0`, policies that use the index only): instead of every
instance, the policy sees the instances the index says hold the prompt's first
block, those this router sent a request with the same first block within
`recent_ttl_s` (their blocks may not be reported yet; kv_aware credits them as
pending), and the `fast_k` instances with the fewest requests in flight (the
best cold choices: Dynamo-style). Instances are bucketed by inflight, each
bucket in order of arrival there, so the K least loaded cost O(K + levels
skipped), not a sort. A policy's view of "the others" shrinks with it: kv_aware's
hot-spot guard compares against the mean inflight of these candidates only.
"""

from __future__ import annotations

import collections
from typing import Iterable, Mapping

from router.index.base import PrefixMatch
from router.policies.base import InstanceState


class RecentSenders:
    """First block -> {instance index: expiry}, for `ttl_s`; expired entries purged in send order."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._table: dict[int, dict[int, float]] = {}
        self._order: collections.deque[tuple[float, int, int]] = collections.deque()

    def record(self, first_block: int, i: int, now: float) -> None:
        expiry = now + self.ttl_s
        self._table.setdefault(first_block, {})[i] = expiry
        self._order.append((expiry, first_block, i))

    def match(self, first_block: int, now: float) -> Iterable[int]:
        order, table = self._order, self._table
        while order and order[0][0] <= now:
            expiry, block, i = order.popleft()
            entry = table.get(block)
            if entry is not None and entry.get(i) == expiry:  # not renewed since
                del entry[i]
                if not entry:
                    del table[block]
        return table.get(first_block, ())


class LoadView:
    def __init__(self, ids: list[str], fast_k: int = 0, recent_ttl_s: float = 2.0) -> None:
        n = len(ids)
        self.ids = ids
        self.position = {inst: i for i, inst in enumerate(ids)}
        self.inflight = [0] * n
        self.queued = [0] * n
        self.engine: list[tuple[int, int, float]] = [(0, 0, 0.0)] * n
        self.tier_costs: list = [None] * n  # what each instance advertises about its tiers (polled)
        self.states = [InstanceState(inst) for inst in ids]
        self._dirty: dict[int, None] = {}
        self.fast_k = fast_k
        self._buckets: list[dict[int, None]] = [dict.fromkeys(range(n))]  # inflight level -> instances
        self._low = 0  # no instance has fewer requests in flight than this
        self.recent = RecentSenders(recent_ttl_s) if fast_k else None

    # -- changes ----------------------------------------------------------------------

    def dispatched(self, i: int, uncached: int, first_block: int | None, now: float) -> None:
        self._move(i, self.inflight[i] + 1)
        self.queued[i] += uncached
        self._dirty[i] = None
        if self.recent is not None and first_block is not None:
            self.recent.record(first_block, i, now)

    def first_token(self, i: int, uncached: int) -> None:
        self.queued[i] -= uncached
        self._dirty[i] = None

    def finished(self, i: int) -> None:
        self._move(i, self.inflight[i] - 1)
        self._dirty[i] = None

    def polled(self, i: int, load: tuple[int, int, float], tier_costs=None) -> None:
        if self.engine[i] != load or self.tier_costs[i] != tier_costs:
            self.engine[i] = load
            self.tier_costs[i] = tier_costs
            self._dirty[i] = None

    def _move(self, i: int, level: int) -> None:
        buckets = self._buckets
        del buckets[self.inflight[i]][i]
        if level == len(buckets):
            buckets.append({})
        buckets[level][i] = None
        self.inflight[i] = level
        if level < self._low:
            self._low = level

    # -- candidates -----------------------------------------------------------------

    def flush(self) -> None:
        states, ids, inflight, queued, engine = self.states, self.ids, self.inflight, self.queued, self.engine
        for i in self._dirty:
            running, waiting, kv_usage = engine[i]
            states[i] = InstanceState(ids[i], inflight[i], queued[i], running, waiting, kv_usage,
                                      tier_costs=self.tier_costs[i])
        self._dirty.clear()

    def all(self) -> list[InstanceState]:
        """Every instance (the list is reused: read it before the next change)."""
        self.flush()
        return self.states

    def fast(self, matches: Mapping[str, PrefixMatch], first_block: int | None, now: float) -> list[InstanceState]:
        """Index holders + recent senders of this first block + the fast_k least loaded."""
        self.flush()
        states, position = self.states, self.position
        chosen: dict[int, None] = {position[inst]: None for inst in matches if inst in position}  # not stores
        if first_block is not None:
            chosen.update(dict.fromkeys(self.recent.match(first_block, now)))
        chosen.update((i, None) for i in self.least_loaded(self.fast_k, skip=chosen))
        return [states[i] for i in chosen]

    def least_loaded(self, k: int, skip: Mapping[int, None] | frozenset = frozenset()) -> Iterable[int]:
        out: list[int] = []
        buckets = self._buckets
        level = self._low
        while level < len(buckets) and not buckets[level]:
            level += 1
        self._low = level
        while level < len(buckets) and len(out) < k:
            for i in buckets[level]:
                if i not in skip:
                    out.append(i)
                    if len(out) == k:
                        break
            level += 1
        return out
