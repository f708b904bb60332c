"""Replication on purpose: copy a hot prefix to one more instance when its demand pays for the copy.

A request's cost (kv_cost.py) prices one request. A copy of a prefix on a second
instance pays off over the requests that follow it, which no single request's cost
can see: under a dominant prefix, the holders' queues grow while every lone miss
elsewhere still looks dearer than waiting. So the policy also tracks, per prefix,
its demand and how much longer its requests wait on their holders than on the other
instances, and copies it when that repays the copy:

    holders   candidates credited within one block of the best credit (they hold the prefix)
    delay_r   the best holder's wait - the mean wait of the non-holders (the queue and
              decode terms of the cost: what a hit's TTFT owes to where it runs), floored
              at 0; the mean, not the least loaded one, because the requests a new holder
              takes later will see its average wait, not today's idle moment
    count     requests for the prefix before this one, decayed with half-life `halflife_s`
    delay     the time average of delay_r (PrefixDemand), this request's sample included
    benefit   = weight x delay x count x ln 2 / (holders + 1)
    replicate when benefit > cost(cheapest non-holder) - cost(best holder)

`count x ln 2` is the decayed count's estimate of the requests the next half-life
brings (a steady rate r gives count = r x halflife / ln 2), and a new holder takes
its 1 / (holders + 1) share of them, each spared `delay`. The copy's price is the
whole cost difference, so it includes the copy's own prefill, the prefill added to
that instance's queue and the cached blocks it evicts there (eviction.py). A
prefix is keyed by its block at the best holder's credited depth: requests that
share that much of the chain share the key. A first request has no count, so no
copy; a burst of siblings adds no time to the average; a long prefill that briefly
fills a holder's queue weighs only as long as it lasts; a queue that stays does.
Once copied, the new holder is credited at once (pending blocks) and later requests
split between the holders by cost.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence

import msgspec

from kvroute.router.decision.base import InstanceState, RouteRequest

_CAPACITY = 65536  # prefixes tracked; the least recently requested is dropped first


class PrefixDemand:
    """Per prefix key: its decayed request count and the time average of its holders' extra wait.

    Each request's extra wait stands for the time since the prefix's previous request
    (sample and hold, backwards): a steady stream of requests measures the wait's time
    average (Poisson arrivals see time averages), while a burst of siblings at one
    instant, each seeing the queue the others made, adds no time and so no weight.
    Count, wait integral and time integral all decay with `halflife_s`.
    """

    def __init__(self, halflife_s: float, capacity: int = _CAPACITY) -> None:
        if halflife_s <= 0:
            raise ValueError(f"the replication half-life must be positive, got {halflife_s}")
        self.halflife_s = halflife_s
        self.capacity = capacity
        # key -> (request count, wait x time, time, as of); all decayed to `as of`
        self._table: collections.OrderedDict[int, tuple[float, float, float, float]] = collections.OrderedDict()

    def _advance(self, key: int, now: float, wait_s: float) -> tuple[float, float, float]:
        count, area, span, since = self._table.get(key, (0.0, 0.0, 0.0, now))
        dt = max(now - since, 0.0)
        decay = 0.5 ** (dt / self.halflife_s)
        held = self.halflife_s / math.log(2) * (1.0 - decay)  # dt, weighted by its decay
        return count * decay, area * decay + wait_s * held, span * decay + held

    def peek(self, key: int, now: float, wait_s: float) -> tuple[float, float]:
        """(requests for `key` seen before now, decayed; their holders' time-averaged extra wait,
        with `wait_s` seen now), without recording anything."""
        count, area, span = self._advance(key, now, wait_s)
        return count, area / span if span > 0 else 0.0

    def record(self, key: int, now: float, wait_s: float) -> None:
        """A request for `key` was routed at `now`, seeing `wait_s` of extra wait on its holders."""
        count, area, span = self._advance(key, now, wait_s)
        self._table.pop(key, None)
        self._table[key] = (count + 1.0, area, span, now)
        if len(self._table) > self.capacity:
            self._table.popitem(last=False)


def holders(candidates: Sequence[InstanceState], credits: Mapping[str, float]) -> tuple[float, list[InstanceState]]:
    """(the best credit, the candidates within one block of it); no holders when nothing is credited."""
    best = max(credits.values(), default=0.0)
    if best < 1.0:
        return best, []
    return best, [c for c in candidates if credits.get(c.id, 0.0) >= best - 1.0]


def benefit(count: float, delay_s: float, num_holders: int) -> float:
    """Seconds of waiting a new holder spares the prefix's requests over the next half-life."""
    return delay_s * count * math.log(2) / (num_holders + 1)


class Copy(msgspec.Struct, frozen=True):
    """A decision to copy the request's prefix onto `target` (or None), and what was measured."""

    target: InstanceState | None
    key: int
    delay_s: float
    reason: str = ""


def consider(request: RouteRequest, candidates: Sequence[InstanceState], credits: Mapping[str, float],
             costs: Mapping[str, float], waits: Mapping[str, float], chosen: InstanceState, demand: PrefixDemand,
             now: float, weight: float = 1.0) -> Copy | None:
    """Whether to copy the prefix that `chosen` holds onto the cheapest non-holder (None: no prefix held).

    `waits[i]` is the cost model's queue and decode wait on i, the part of a hit's TTFT
    that depends on where it runs.
    """
    best = max(credits.values(), default=0.0)
    credit_of = credits.get
    if best < 1.0 or credit_of(chosen.id, 0.0) < best - 1.0:  # no holders, or `chosen` is not one
        return None
    floor = best - 1.0  # as `holders`, in one pass
    others = [c for c in candidates if credit_of(c.id, 0.0) < floor]
    if not others:
        return None
    held = len(candidates) - len(others)
    delay = max(waits[chosen.id] - sum([waits[c.id] for c in others]) / len(others), 0.0)
    key = request.block_hashes[min(math.ceil(best), len(request.block_hashes)) - 1]
    count, mean = demand.peek(key, now, delay)
    target = min(others, key=lambda c: costs[c.id])
    gain, price = weight * benefit(count, mean, held), costs[target.id] - costs[chosen.id]
    if gain <= price:
        return Copy(None, key, delay)
    return Copy(target, key, delay, f"replicated a hot prefix onto {target.id}: {count:.1f} recent requests, "
                f"{mean * 1e3:.1f} ms longer wait on its {held} holder(s) on average; the copy spares "
                f"{gain:.3f} s and costs {price:.3f} s")
