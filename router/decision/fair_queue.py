"""The router-side admission queue: strict priority bands, weighted fairness between tenants.

Within a band, start-time fair queueing (virtual time): a tenant's new entry is tagged
`max(band's virtual time, tenant's last tag) + 1 / weight`, and the lowest tag is served
first, so tenants that keep a backlog are served in proportion to their weights and a
tenant that sends little is served almost at once. Bands are strict: band 0 (most urgent)
empties before band 1 is served. `ahead` is exact: the entries a new request of that
tenant and band would wait behind. Pure: no clock, no I/O; the router service and the
simulator drive the same queue (docs/admission.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping


@dataclasses.dataclass(eq=False, kw_only=True, slots=True)
class QueueEntry:
    tenant: str
    band: int
    tag: float
    seq: int
    arrived: float  # on the caller's clock
    item: object  # the caller's (a waiting request)

    def key(self) -> tuple[float, int]:
        return (self.tag, self.seq)


class FairQueue:
    def __init__(self, bands: int) -> None:
        if bands < 1:
            raise ValueError(f"a queue needs at least one band, got {bands}")
        self._bands: list[list[tuple[float, int, QueueEntry]]] = [[] for _ in range(bands)]
        self._vtime = [0.0] * bands
        self._last: dict[tuple[int, str], float] = {}
        self._count: dict[tuple[int, str], int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(b) for b in self._bands)

    def _tag(self, tenant: str, band: int, weight: float) -> float:
        start = max(self._vtime[band], self._last.get((band, tenant), 0.0))
        return start + 1.0 / weight

    def push(self, *, tenant: str, band: int, weight: float, arrived: float, item: object) -> QueueEntry:
        tag = self._tag(tenant, band, weight)
        entry = QueueEntry(tenant=tenant, band=band, tag=tag, seq=next(self._seq), arrived=arrived, item=item)
        self._last[(band, tenant)] = tag
        self._count[(band, tenant)] = self._count.get((band, tenant), 0) + 1
        bisect.insort(self._bands[band], (tag, entry.seq, entry))
        return entry

    def ahead(self, tenant: str, band: int, weight: float) -> int:
        """Entries a new request of `tenant` in `band` would be served after."""
        higher = sum(len(b) for b in self._bands[:band])
        tag = self._tag(tenant, band, weight)
        return higher + bisect.bisect_right(self._bands[band], (tag, math.inf))  # equal tags queued first go first

    def head(self) -> QueueEntry | None:
        for entries in self._bands:
            if entries:
                return entries[0][2]
        return None

    def remove(self, entry: QueueEntry, served: bool = False) -> bool:
        """Take `entry` out (served: the band's virtual time moves to its tag); False if not queued."""
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
            self._vtime[entry.band] = max(self._vtime[entry.band], entry.tag - 1e-12)
        if not entries:  # an idle band forgets: the next tenant starts from its virtual time
            self._last = {k: v for k, v in self._last.items() if k[0] != entry.band}
        return True

    def depth(self) -> dict[tuple[str, int], int]:
        """Queued entries by (tenant, band)."""
        return {(tenant, band): n for (band, tenant), n in self._count.items()}

    def entries(self) -> Iterator[QueueEntry]:
        for band in self._bands:
            for _, _, entry in band:
                yield entry

    def victim(self, tenant: str, band: int, weights: Mapping[str, float]) -> QueueEntry | None:
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
