"""Round robin: exact rotation over the candidates in a stable order (sorted by id).

The policy remembers only the id it routed to last (set by `on_routed`). `select`
returns the first candidate whose id sorts after that one, wrapping around to the
smallest. An instance missing from `candidates` (unhealthy) is simply skipped, and
the others keep their order: with a, b, c and b ejected the sequence goes a, c, a, c,
and resumes a, b, c once b is back. `select` has no side effect, so a dry run
(`/router/explain`) does not advance the rotation.

Parameters: none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvroute.router.decision.base import Decision, InstanceState, PolicyBase, RouteRequest
from kvroute.router.index.base import PrefixMatch


class RoundRobinPolicy(PolicyBase):
    def __init__(self, **injections) -> None:
        super().__init__(**injections)
        self._last: str | None = None

    def select(
        self, request: RouteRequest, candidates: Sequence[InstanceState], matches: Mapping[str, PrefixMatch]
    ) -> Decision:
        ids = sorted(c.id for c in candidates)
        chosen = ids[0]
        if self._last is not None:
            chosen = next((i for i in ids if i > self._last), ids[0])
        return Decision(instance=chosen, reason=f"round robin after {self._last}")

    def on_routed(self, request: RouteRequest, instance: str) -> None:
        self._last = instance
