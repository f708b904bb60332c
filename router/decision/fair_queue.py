"""The router-side admission queue: strict priority bands, weighted fairness between tenants.

Within a band, start-time fair queueing (virtual time): a tenant's new entry is tagged
`max(band's virtual time, tenant's last tag) + 1 / weight`, and the lowest tag is served
first, so tenants that keep a backlog are served in proportion to their weights and a
tenant that sends little is served almost at once. A request admitted without queueing is
tagged and served at once (`passed`), so it counts in its tenant's share as a queued one does.
An entry that leaves unserved (refused at its deadline, displaced, its client gone) gives its
1 / weight back to its tenant's last tag: weights share what is served, and a tenant whose
requests expire is not served less. Bands are strict: band 0 (most urgent) empties before
band 1 is served. `ahead` is exact: the entries a new request of that
tenant and band would wait behind. Pure: no clock, no I/O; the router service and the
simulator drive the same queue (docs/admission.md).

Where the tags come from is a `Tags` (3-5 methods): `LocalTags`, this queue's own virtual time,
or the fleet's, shared by router replicas (router/decision/fleet_share.py `SharedTags`), whose
`in_turn` also says whether an entry's tag is not too far ahead of the other replicas' queues.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")  # what waits: a router ticket, a simulated request


@dataclasses.dataclass(eq=False, kw_only=True, slots=True)
class QueueEntry(Generic[T]):
    tenant: str
    band: int
    tag: float
    seq: int
    arrived: float  # on the caller's clock
    item: T  # the caller's (a waiting request)
    cost: float = 0.0  # 1 / weight: what its tag added to its tenant's

    def key(self) -> tuple[float, int]:
        return (self.tag, self.seq)


class Tags(Protocol):
    """The virtual time a queue tags its entries by: per band, and each tenant's last tag."""

    def start(self, band: int, tenant: str) -> float:
        """A new entry's start: the band's virtual time, or the tenant's last tag if later."""

    def issued(self, band: int, tenant: str, tag: float, weight: float) -> None:
        """A new entry of `tenant` was tagged `tag` (its start + 1 / weight)."""

    def served(self, band: int, tag: float) -> None:
        """The entry tagged `tag` was served: the band's virtual time moves to it."""

    def emptied(self, band: int) -> None:
        """The band's queue is empty."""

    def withdrawn(self, band: int, tenant: str, cost: float) -> None:
        """An entry of `tenant` left unserved (refused, or its client left): its cost is given back."""

    def in_turn(self, band: int, tag: float) -> bool:
        """An entry tagged `tag` may be served now as far as other queues are concerned."""


class LocalTags:
    """One queue's own virtual time; an idle band forgets its tenants' tags (the next starts afresh)."""

    def __init__(self, bands: int) -> None:
        self.vtime = [0.0] * bands
        self.last: dict[tuple[int, str], float] = {}

    def start(self, band: int, tenant: str) -> float:
        return max(self.vtime[band], self.last.get((band, tenant), 0.0))

    def issued(self, band: int, tenant: str, tag: float, weight: float) -> None:
        self.last[(band, tenant)] = tag

    def served(self, band: int, tag: float) -> None:
        self.vtime[band] = max(self.vtime[band], tag - 1e-12)

    def emptied(self, band: int) -> None:
        self.last = {k: v for k, v in self.last.items() if k[0] != band}

    def withdrawn(self, band: int, tenant: str, cost: float) -> None:
        key = (band, tenant)
        if key in self.last:
            self.last[key] -= cost

    def in_turn(self, band: int, tag: float) -> bool:
        return True


class FairQueue(Generic[T]):
    def __init__(self, bands: int, tags: Tags | None = None) -> None:
        if bands < 1:
            raise ValueError(f"a queue needs at least one band, got {bands}")
        self._bands: list[list[tuple[float, int, QueueEntry[T]]]] = [[] for _ in range(bands)]
        self.tags: Tags = tags if tags is not None else LocalTags(bands)
        self._count: dict[tuple[int, str], int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(b) for b in self._bands)

    def _tag(self, tenant: str, band: int, weight: float) -> float:
        return self.tags.start(band, tenant) + 1.0 / weight

    def in_turn(self, tenant: str, band: int, weight: float, entry: QueueEntry[T] | None = None) -> bool:
        """`entry` (else a new entry of `tenant` in `band`) may be served now as far as the other
        replicas' queues are concerned (always, for a queue of its own: `LocalTags`)."""
        return self.tags.in_turn(band, entry.tag if entry is not None else self._tag(tenant, band, weight))

    def head_tags(self) -> dict[int, float]:
        """Per band with entries, its head's tag (what a replica tells the others)."""
        return {band: entries[0][0] for band, entries in enumerate(self._bands) if entries}

    def push(self, *, tenant: str, band: int, weight: float, arrived: float, item: T) -> QueueEntry[T]:
        tag = self._tag(tenant, band, weight)
        entry = QueueEntry(tenant=tenant, band=band, tag=tag, seq=next(self._seq), arrived=arrived, item=item,
                           cost=1.0 / weight)
        self.tags.issued(band, tenant, tag, weight)
        self._count[(band, tenant)] = self._count.get((band, tenant), 0) + 1
        bisect.insort(self._bands[band], (tag, entry.seq, entry))
        return entry

    def passed(self, tenant: str, band: int, weight: float) -> None:
        """A request of `tenant` in `band` was admitted without queueing: it is tagged and served at once,
        so what a tenant is served ahead of the queue counts in its share as what it waited for."""
        tag = self._tag(tenant, band, weight)
        self.tags.issued(band, tenant, tag, weight)
        self.tags.served(band, tag)

    def ahead(self, tenant: str, band: int, weight: float) -> int:
        """Entries a new request of `tenant` in `band` would be served after."""
        higher = sum(len(b) for b in self._bands[:band])
        tag = self._tag(tenant, band, weight)
        return higher + bisect.bisect_right(self._bands[band], (tag, math.inf))  # equal tags queued first go first

    def head(self) -> QueueEntry[T] | None:
        for entries in self._bands:
            if entries:
                return entries[0][2]
        return None

    def remove(self, entry: QueueEntry[T], served: bool = False) -> bool:
        """Take `entry` out (served: the band's virtual time moves to its tag; else its tenant gets its
        cost back, so a tenant whose requests are refused is not also served less); False if not queued."""
        entries = self._bands[entry.band]
        i = bisect.bisect_left(entries, (entry.tag, entry.seq))
        if i >= len(entries) or entries[i][2] is not entry:
            return False
        del entries[i]
        key = (entry.band, entry.tenant)
        self._count[key] -= 1
        if not self._count[key]:
            del self._count[key]
        if served:
            self.tags.served(entry.band, entry.tag)
        else:
            self.tags.withdrawn(entry.band, entry.tenant, entry.cost)
        if not entries:  # an idle band forgets: the next tenant starts from its virtual time
            self.tags.emptied(entry.band)
        return True

    def depth(self) -> dict[tuple[str, int], int]:
        """Queued entries by (tenant, band)."""
        return {(tenant, band): n for (band, tenant), n in self._count.items()}

    def entries(self) -> Iterator[QueueEntry[T]]:
        for band in self._bands:
            for _, _, entry in band:
                yield entry

    def victim(self, tenant: str, band: int, weights: Mapping[str, float]) -> QueueEntry[T] | None:
        """The entry a new request of `tenant` in `band` displaces when the queue is full: the
        newest of the least urgent band below it; else, in its own band, the newest entry of the
        tenant furthest over its weighted share, if that is not `tenant` itself."""
        for lower in range(len(self._bands) - 1, band, -1):
            if self._bands[lower]:
                return self._bands[lower][-1][2]
        counts = {t: n for (b, t), n in self._count.items() if b == band}
        if not counts:
            return None
        counts[tenant] = counts.get(tenant, 0) + 1
        worst = max(counts, key=lambda t: (counts[t] / weights.get(t, 1.0), t != tenant))
        if worst == tenant:
            return None
        newest = [e for _, _, e in self._bands[band] if e.tenant == worst]
        return newest[-1] if newest else None


def band_of(priority: int, edges: tuple[int, ...]) -> int:
    """The band of a request priority (lower is more urgent, as vLLM's `priority`): the number of
    `edges` at or below it, so edges (0, 1) make three bands: < 0, 0, >= 1."""
    return bisect.bisect_right(edges, priority)
