"""Routable instances by (model, roles), kept current without a pass over the fleet per request.

A `Group` is the instances that serve one model in some roles and take requests now,
with an id map and their in-flight counts in a `LeastLoaded` (router/decision/candidates.py).
Groups are built on first use and dropped whenever anything that decides routability
changes (the fleet's `Generation`: health, reachability, draining, role, membership), which
happens on probes and polls, not per request. In-flight counts move the instance within
its groups in O(1) as requests start and end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvroute.router.decision.candidates import LeastLoaded
from kvroute.router.fleet.instance import Generation, Instance


class Group:
    __slots__ = ("members", "by_id", "load")

    def __init__(self, members: list[Instance]) -> None:
        self.members = members
        self.by_id = {i.id: i for i in members}
        self.load = LeastLoaded(members, level_of=lambda i: i.inflight)
        for inst in members:
            inst.groups.append(self)

    def states(self, chosen: Sequence[Instance]) -> list:  # router/decision/route.py Members
        return [i.state() for i in chosen]


class Groups:
    def __init__(self, instances: Sequence[Instance], generation: Generation) -> None:
        self.instances = instances
        self.fleet_generation = generation
        self.generation = -1  # the fleet's generation the groups were built at
        self._groups: dict[tuple, Group] = {}

    def get(self, model: str | None, roles: Iterable[str] | None = None) -> Group:
        if self.fleet_generation.value != self.generation:
            self.generation = self.fleet_generation.value
            self._groups.clear()
            for inst in self.instances:
                inst.groups = []
        wanted = tuple(roles) if roles is not None else None
        key = (model, wanted)
        group = self._groups.get(key)
        if group is None:
            members = [i for i in self.instances if i.routable and i.info is not None  # routable: it has info
                       and (model is None or i.info.model == model) and (wanted is None or i.info.role in wanted)]
            group = self._groups[key] = Group(members)
        return group
