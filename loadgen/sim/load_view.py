"""The simulated router's view of every instance: `InstanceState`s kept current incrementally.

Router-side load is what the real router's proxy tracks (router/service/proxy.py): on
dispatch an instance gets +1 inflight and the request's predicted uncached tokens
as queued prefill work, removed at its first token (or its end, if none came).
Engine-side `running`, `waiting`, `kv_usage` and the eviction profile
(`kv_free_blocks`, `kv_evictable`) are whatever the last load poll saw (`polled`,
a `LoadRecord` as GET /load serves it, its `ts` on the virtual clock).

Each change marks the instance dirty; its frozen `InstanceState` is rebuilt when a
decision reads it (`state`), as the router's `Instance.state()` is: a fast-path decision
reads its candidates' only, one over every instance `flush`es the dirty ones into a list
that is kept (and handed to the policy) instead of rebuilt.

A decision (router/decision/route.py `RouteDecision`) routes in a `SimGroup`: the
instances in some roles (all of them, or the prefill or decode ones when
disaggregated), by position, with their in-flight counts in a `LeastLoaded`, as the
router's groups are (router/fleet/groups.py). Groups are rebuilt when a role changes
(`set_role`), and kept current in O(1) per in-flight change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Sequence as SequenceABC

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.decision.base import NO_PEER_LOAD, InstanceState, PeerLoad, with_peer_charges
from kvroute.router.decision.candidates import LeastLoaded


class FleetStates(SequenceABC):
    """Every instance's state, each rebuilt when read (a policy that reads none, like the oracle,
    rebuilds none); iterating flushes every dirty one first."""

    __slots__ = ("_states", "_state_of", "_flush")

    def __init__(self, states: list[InstanceState], state_of: Callable[[int], InstanceState],
                 flush: Callable[[], None]) -> None:
        self._states, self._state_of, self._flush = states, state_of, flush

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, i):
        if isinstance(i, slice):
            self._flush()
            return self._states[i]
        return self._state_of(i if i >= 0 else len(self._states) + i)

    def __iter__(self) -> Iterator[InstanceState]:
        self._flush()
        return iter(self._states)


class SimGroup:
    """Members (instance positions) in some roles, as `router.decision.route.Members`."""

    __slots__ = ("members", "by_id", "load", "_states", "_state_of", "_all")

    def __init__(self, members: list[int], by_id: Mapping[str, int], inflight: list[int],
                 states: list[InstanceState], state_of: Callable[[int], InstanceState],
                 flush: Callable[[], None]) -> None:
        self.members = members
        self.by_id = by_id
        self.load = LeastLoaded(members, level_of=inflight.__getitem__)
        self._states = states  # the view's list, updated in place
        self._state_of = state_of
        self._all = FleetStates(states, state_of, flush)

    def states(self, chosen: Sequence[int]) -> Sequence[InstanceState]:
        states = self._states
        if chosen is self.members and len(chosen) == len(states):
            return self._all
        state_of = self._state_of
        return [state_of(i) for i in chosen]


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
        self.peers = [NO_PEER_LOAD] * n  # other router replicas' charges, shared admission's
        self.roles = ["both"] * n
        self._dirty: dict[int, None] = {}
        self.everyone = self._group(list(range(n)), self.position)
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

    def peer_charges(self, charges: list[PeerLoad]) -> None:
        """The other replicas' router-side charges per instance, as shared admission last synced them."""
        for i, charge in enumerate(charges):
            if self.peers[i] != charge:
                self.peers[i] = charge
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
        for i in list(self._dirty):
            self.state(i)

    def state(self, i: int) -> InstanceState:
        """Instance i's state now, rebuilt only if it changed since it was last read."""
        if i in self._dirty:
            del self._dirty[i]
            load = self.engine[i]
            inflight, queued = with_peer_charges(self.inflight[i], self.queued[i], self.peers[i], load)
            self.states[i] = InstanceState.of(self.ids[i], inflight=inflight, queued_prefill_tokens=queued, load=load,
                                              measured_at=load.ts if load else 0.0, tier_costs=self.tier_costs[i])
        return self.states[i]

    def _group(self, members: list[int], by_id: Mapping[str, int]) -> SimGroup:
        return SimGroup(members, by_id, self.inflight, self.states, self.state, self.flush)

    def all(self) -> SimGroup:
        """Every instance (its states current when read, before the next change)."""
        return self.everyone

    def group(self, roles: tuple[str, ...]) -> SimGroup:
        """The instances in `roles`."""
        group = self._groups.get(roles)
        if group is None:
            members = [i for i, role in enumerate(self.roles) if role in roles]
            by_id = {self.ids[i]: i for i in members}
            group = self._groups[roles] = self._group(members, by_id)
        return group
