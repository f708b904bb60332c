"""One routing decision, for the router and the simulator: candidates, filters, policy, bookkeeping.

`RouteDecision` is synchronous and does no I/O: the caller looks the prompt's blocks up in
its index first (the router awaits its index, the simulator calls the memory index) and
hands over the matches with the group it routes in (`Members`: router/fleet/groups.py
`Group` in the router, loadgen/sim/load_view.py `SimGroup` in the simulator).

    candidates  every member; or, with `fast_candidates` K > 0, an index policy and more
                than K members, the fast path (candidates.py `pick`): index holders of the
                prompt's first block, this decision's recent senders of it, the K least loaded
    filter      drop `exclude` (instances tried already) and members at `max_inflight`;
                when that leaves no fast candidate, filter every member instead
    select      the policy's choice among their `InstanceState`s
    routed      (when the request is sent) the policy's `on_routed` and the recent sender

`plan_prefill` is the disaggregated variant (router/service/disagg.py,
loadgen/sim/disagg.py): the prefill engine the policy picks among the prefill group, or
None when the prompt's predicted uncached tokens there are fewer than `min_uncached`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import msgspec

from kvroute.router.decision.base import Decision, InstanceState, Policy, RouteRequest
from kvroute.router.decision.candidates import LeastLoaded, RecentSenders, pick
from kvroute.router.index.base import PrefixMatch

M = TypeVar("M", bound=Hashable)  # a member: an Instance in the router, a position in the simulator


class Members(Protocol[M]):
    """The instances one decision may choose among: in a fixed order, by id, by requests in flight."""

    @property
    def members(self) -> Sequence[M]: ...

    @property
    def by_id(self) -> Mapping[str, M]: ...

    @property
    def load(self) -> LeastLoaded: ...

    def states(self, chosen: Sequence[M]) -> Sequence[InstanceState]:
        """The policy's view of `chosen` (members), in that order."""


@dataclasses.dataclass(frozen=True, slots=True)
class RouteSettings:
    fast_candidates: int = 0  # K > 0: the fast path for index policies
    recent_ttl_s: float = 2.0  # fast path: how long a sent first block keeps its instance a candidate
    max_inflight: int = 0  # > 0: members with this many requests in flight are not candidates


class NoCandidates(Exception):
    """Every member was excluded or is at `max_inflight` (`overloaded`: no exclusion was asked)."""

    def __init__(self, overloaded: bool) -> None:
        super().__init__("overloaded" if overloaded else "every member excluded")
        self.overloaded = overloaded


class Routed(msgspec.Struct, Generic[M], frozen=True, kw_only=True):
    member: M  # the chosen member (an Instance in the router, a position in the simulator)
    decision: Decision
    candidates: Sequence[M]  # the members the policy chose among
    state: InstanceState  # the chosen member's state, as the policy saw it


def uncached_tokens(decision: Decision, state: InstanceState, matches: Mapping[str, PrefixMatch],
                    num_tokens: int, block_size: int) -> int:
    """The decision's predicted uncached prompt tokens: the policy's, else the index's."""
    if decision.uncached_tokens is not None:
        return decision.uncached_tokens
    match = matches.get(decision.instance) if state.cache_ok else None
    return max(0, num_tokens - match.blocks * block_size) if match is not None else num_tokens


class RouteDecision:
    def __init__(self, policy: Policy, settings: RouteSettings = RouteSettings()) -> None:
        self.policy = policy
        self.settings = settings
        self.fast_k = settings.fast_candidates if policy.uses_index else 0
        self.recent = RecentSenders(settings.recent_ttl_s) if self.fast_k else None

    def overloaded(self, members: Members[M]) -> bool:
        """Every member is at `max_inflight` (cheap: the least loaded one tells)."""
        limit = self.settings.max_inflight
        return bool(limit) and all(s.inflight >= limit for s in members.states(members.load.least(1)))

    def choose(self, route: RouteRequest, members: Members[M], matches: Mapping[str, PrefixMatch], now: float,
               exclude: Sequence[str] = (), fast: bool = True) -> Routed[M]:
        """The policy's choice among the candidates (no bookkeeping: see `routed`)."""
        candidates = self._candidates(route, members, matches, now) if fast else members.members
        states = members.states(candidates)
        limit = self.settings.max_inflight
        if exclude or limit:
            usable = [s for s in states if s.id not in exclude and (not limit or s.inflight < limit)]
            if not usable:
                usable = [s for s in members.states(members.members)
                          if s.id not in exclude and (not limit or s.inflight < limit)]
            if not usable:
                raise NoCandidates(overloaded=bool(limit) and not exclude)
            by_id = members.by_id
            states, candidates = usable, [by_id[s.id] for s in usable]
        decision = self.policy.select(route, states, matches)
        member = members.by_id[decision.instance]
        return Routed(member=member, decision=decision, candidates=candidates, state=members.states((member,))[0])

    def routed(self, route: RouteRequest, instance: str, now: float) -> None:
        """The request was sent to `instance`: the policy learns it, and so do the recent senders."""
        self.policy.on_routed(route, instance)
        hashes = route.block_hashes
        if self.recent is not None and hashes:
            self.recent.record(hashes[0], instance, now)

    def decide(self, route: RouteRequest, members: Members[M], matches: Mapping[str, PrefixMatch], now: float,
               exclude: Sequence[str] = ()) -> Routed[M]:
        """`choose`, then `routed`: one request's whole decision."""
        routed = self.choose(route, members, matches, now, exclude)
        self.routed(route, routed.decision.instance, now)
        return routed

    def _candidates(self, route: RouteRequest, members: Members[M], matches: Mapping[str, PrefixMatch],
                    now: float) -> Sequence[M]:
        k, everyone = self.fast_k, members.members
        if not k or len(everyone) <= k:
            return everyone
        by_id, hashes = members.by_id, route.block_hashes
        recent = self.recent.match(hashes[0], now) if hashes and self.recent is not None else ()
        return pick([by_id[i] for i in matches if i in by_id], [by_id[i] for i in recent if i in by_id],
                    members.load, k)

    def plan_prefill(self, route: RouteRequest, prefill: Members[M], matches: Mapping[str, PrefixMatch], now: float,
                     min_uncached: int, exclude: Sequence[str] = (), record: bool = True) -> Routed[M] | None:
        """The prefill engine for a disaggregated request, or None to run it whole on a decode engine
        (no prefill engine left, or fewer than `min_uncached` predicted uncached tokens there).
        `record=False` (an explanation) looks at every prefill engine and records nothing."""
        if not prefill.members:
            return None
        try:
            routed = self.choose(route, prefill, matches, now, exclude, fast=record)
        except NoCandidates:
            return None
        if uncached_tokens(routed.decision, routed.state, matches, route.num_tokens,
                           route.block_size) < min_uncached:
            return None
        if record:
            self.routed(route, routed.decision.instance, now)
        return routed
