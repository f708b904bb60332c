"""The simulated router's view of every instance: `InstanceState`s kept current incrementally.

Router-side load is what the real router's proxy tracks (router/service/proxy.py): on
dispatch an instance gets +1 inflight and the request's predicted uncached tokens
as queued prefill work, removed at its first token (or its end, if none came).
Engine-side `running`, `waiting`, `kv_usage` and the eviction profile
(`kv_free_blocks`, `kv_evictable`) are whatever the last load poll saw (`polled`,
a `LoadRecord` as GET /load serves it, its `ts` on the virtual clock).

Each change marks the instance dirty; before a decision `flush` rebuilds the
frozen `InstanceState` of the dirty instances only, in a list that is kept (and
handed to the policy) instead of rebuilt: O(changed instances) per decision, not
O(instances).

Fast path (`fast_k > 0`, policies that use the index only): the router's own
candidate choice (router/decision/candidates.py `pick`): index holders of the prompt's first
block, recent senders of it, and the `fast_k` least loaded. A policy's view of "the
others" shrinks with it: kv_aware's hot-spot guard compares against the mean inflight
of these candidates only.
"""

from __future__ import annotations

from typing import Mapping

from router.decision.candidates import LeastLoaded, RecentSenders, pick
from router.index.base import PrefixMatch
from router.decision.base import InstanceState
from router.contract.protocol import LoadRecord


class LoadView:
    def __init__(self, ids: list[str], fast_k: int = 0, recent_ttl_s: float = 2.0) -> None:
        n = len(ids)
        self.ids = ids
        self.position = {inst: i for i, inst in enumerate(ids)}
        self.inflight = [0] * n
        self.queued = [0] * n
        self.engine: list[LoadRecord | None] = [None] * n
        self.tier_costs: list = [None] * n  # what each instance advertises about its tiers (polled)
        self.states = [InstanceState(inst) for inst in ids]
        self._dirty: dict[int, None] = {}
        self.fast_k = fast_k
        self.load_levels = LeastLoaded(range(n))  # by requests in flight
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

    def polled(self, i: int, load: LoadRecord, tier_costs=None) -> None:
        self.engine[i] = load
        self.tier_costs[i] = tier_costs
        self._dirty[i] = None

    def _move(self, i: int, level: int) -> None:
        self.inflight[i] = level
        self.load_levels.set(i, level)

    # -- candidates -----------------------------------------------------------------

    def flush(self) -> None:
        states, ids, inflight, queued, engine = self.states, self.ids, self.inflight, self.queued, self.engine
        for i in self._dirty:
            load = engine[i]
            states[i] = InstanceState.of(ids[i], inflight[i], queued[i], load, load.ts if load else 0.0,
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
        recent = self.recent.match(first_block, now) if first_block is not None else ()
        holders = (position[inst] for inst in matches if inst in position)  # not a shared store's owner
        return [states[i] for i in pick(holders, recent, self.load_levels, self.fast_k)]
