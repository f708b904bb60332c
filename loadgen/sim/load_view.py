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

A decision (router/decision/route.py `RouteDecision`) routes in a `SimGroup`: the
instances in some roles (all of them, or the prefill or decode ones when
disaggregated), by position, with their in-flight counts in a `LeastLoaded`, as the
router's groups are (router/fleet/groups.py). Groups are rebuilt when a role changes
(`set_role`), and kept current in O(1) per in-flight change.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from router.decision.base import InstanceState
from router.decision.candidates import LeastLoaded
from router.contract.protocol import LoadRecord


class SimGroup:
    """Members (instance positions) in some roles, as `router.decision.route.Members`."""

    __slots__ = ("members", "by_id", "load", "_states")

    def __init__(self, members: list[int], by_id: Mapping[str, int], inflight: list[int],
                 states: list[InstanceState]) -> None:
        self.members = members
        self.by_id = by_id
        self.load = LeastLoaded(members, level_of=inflight.__getitem__)
        self._states = states  # the view's list, updated in place

    def states(self, chosen: Sequence[int]) -> Sequence[InstanceState]:
        states = self._states
        if chosen is self.members and len(chosen) == len(states):
            return states
        return [states[i] for i in chosen]


class LoadView:
    def __init__(self, ids: list[str], tier_costs: list | None = None) -> None:
        n = len(ids)
        self.ids = ids
        self.position = {inst: i for i, inst in enumerate(ids)}
        self.inflight = [0] * n
        self.queued = [0] * n
        self.engine: list[LoadRecord | None] = [None] * n
        # what each instance advertises about its tiers: at start (its /kv/info), then polled
        self.tier_costs: list = list(tier_costs) if tier_costs is not None else [None] * n
        self.states = [InstanceState(inst, tier_costs=costs) for inst, costs in zip(ids, self.tier_costs)]
        self.roles = ["both"] * n
        self._dirty: dict[int, None] = {}
        self.everyone = SimGroup(list(range(n)), self.position, self.inflight, self.states)
        self._groups: dict[tuple[str, ...], SimGroup] = {}

    # -- changes ----------------------------------------------------------------------

    def dispatched(self, i: int, uncached: int) -> None:
        self._move(i, self.inflight[i] + 1)
        self.queued[i] += uncached
        self._dirty[i] = None

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

    def set_role(self, i: int, role: str) -> None:
        if self.roles[i] != role:
            self.roles[i] = role
            self._groups.clear()

    def _move(self, i: int, level: int) -> None:
        self.inflight[i] = level
        self.everyone.load.set(i, level)
        for group in self._groups.values():
            group.load.set(i, level)

    # -- groups -----------------------------------------------------------------------

    def flush(self) -> None:
        states, ids, inflight, queued, engine = self.states, self.ids, self.inflight, self.queued, self.engine
        for i in self._dirty:
            load = engine[i]
            states[i] = InstanceState.of(ids[i], inflight[i], queued[i], load, load.ts if load else 0.0,
                                         tier_costs=self.tier_costs[i])
        self._dirty.clear()

    def all(self) -> SimGroup:
        """Every instance, current (read it before the next change)."""
        self.flush()
        return self.everyone

    def group(self, roles: tuple[str, ...]) -> SimGroup:
        """The instances in `roles`, current."""
        self.flush()
        group = self._groups.get(roles)
        if group is None:
            members = [i for i, role in enumerate(self.roles) if role in roles]
            by_id = {self.ids[i]: i for i in members}
            group = self._groups[roles] = SimGroup(members, by_id, self.inflight, self.states)
        return group
