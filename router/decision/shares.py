"""Weighted fair shares of a contended fleet: whom admission holds back so that the weights hold.

Start-time fair queueing (fair_queue.py) orders what waits in the router, but under a flood the
queue holds about one entry: an arrival is refused once its wait would pass the SLO, so almost
every admission goes to whichever request comes first when the engines free up. The weights act
in the decision itself instead (admission.py `held_back`, called on arrival and at the queue's head).

The fair share is max-min weighted (water-filling) over the tenants' demand, the requests that
arrived lately within their own limits, admitted or refused (a refused tenant still wants its share):

    capacity  C     what the fleet admitted lately (requests/s, decaying with a half-life)
    level     L     sum over tenants of min(demand_t, L x weight_t) = C; infinite when the
                    demand does not fill C (nobody is over a share then)
    due       u     min(demand_u, L x weight_u)
    held back t     admitted_t > L x weight_t, while a tenant u with admitted_u < due_u asked
                    lately (it takes the slot), one of the two clearly so (TOLERANCE, SHORT);
                    admission.py adds: and the fleet is contended
    light     t     admitted_t <= LIGHT x L x weight_t: it may go past the engines' threshold

A tenant asking less than L x weight gets all it asks and is never refused for another's flood;
the rest share what is left by weight; a tenant alone has L x weight = C, the whole fleet. One
tenant can be over its share only while another gets less than it asks, so holding it back hands
the next free slot to a tenant short of its due. A tenant that stopped sending (its counts still
remember its demand for a few half-lives) holds nobody back. With router replicas the counts are
the fleet's (fleet_share.py `SharedRates`, synced through the ledger), so every replica judges a
tenant by what the whole fleet admitted and was asked.

Pure, the clock an argument: the router service and the simulator call the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

FORGET = 1e-3  # a decayed count below this is forgotten
TOLERANCE = 0.05  # a tenant is clearly over its share past (1 + TOLERANCE) x it
SHORT = 0.05  # a tenant is clearly short of its due below (1 - SHORT) x it
LIGHT = 0.5  # a tenant admitted at most this share of its weighted share, while others flood, is light
ACTIVE = 0.02  # without demand counts: the tenants admitted more than this share of the total share the fleet


class Counts:
    """Per tenant, events counted with a half-life: `rate` is events per second. The counts are kept
    scaled to one reference time, so reading every tenant's rate is a multiplication each (admission
    reads them on every contended decision, with as many tenants as the fleet serves); an event
    moves the reference up, forgetting the long idle, once it is RESCALE half-lives behind. Reading
    changes nothing; a clock that went back decays nothing (decay.py)."""

    RESCALE = 32.0  # half-lives between rescalings (2^32: far from a float's range)

    def __init__(self, halflife_s: float) -> None:
        self.halflife_s = halflife_s
        self._scaled: dict[str, float] = {}  # tenant -> its decayed count as of `_ref`, times 2^((latest - _ref) / h)
        self._ref = 0.0
        self._latest = -math.inf  # the latest event's time: the counts never decay back before it

    def _decay(self, now: float) -> float:
        """0.5^((now - reference) / half-life): what the scaled counts are worth at `now`."""
        return 0.5 ** ((max(now, self._latest) - self._ref) / self.halflife_s)

    def value(self, tenant: str, now: float) -> float:
        return self._scaled.get(tenant, 0.0) * self._decay(now)

    def add(self, tenant: str, now: float) -> None:
        now = self._latest = max(self._latest, now)
        if now - self._ref > self.RESCALE * self.halflife_s or not self._scaled:
            factor = self._decay(now)
            self._scaled = {t: v * factor for t, v in self._scaled.items() if v * factor > FORGET}
            self._ref = now
        self._scaled[tenant] = self._scaled.get(tenant, 0.0) + 2.0 ** ((now - self._ref) / self.halflife_s)

    def rates(self, now: float) -> dict[str, float]:
        per_count = math.log(2) / self.halflife_s * self._decay(now)
        return {t: r for t, v in self._scaled.items() if (r := v * per_count) > FORGET}  # the long idle left out


class Rates:
    """Requests admitted per second (the drain rate, and weighted shares) and requests arrived per
    second (the demand), per tenant: counts decaying with one half-life."""

    def __init__(self, halflife_s: float) -> None:
        self.halflife_s = halflife_s
        self._admitted = Counts(halflife_s)
        self._arrived = Counts(halflife_s)
        self._last: dict[str, float] = {}  # tenant -> when it was last admitted
        self._asked: dict[str, float] = {}  # tenant -> when a request of it last arrived

    def add(self, tenant: str, now: float) -> None:
        """A request of `tenant` was admitted."""
        self._admitted.add(tenant, now)
        self._last[tenant] = now

    def arrived(self, tenant: str, now: float) -> None:
        """A request of `tenant` asks to be admitted (within its own limits), whatever comes of it."""
        self._arrived.add(tenant, now)
        self._asked[tenant] = now

    def arrived_since(self, since: float) -> set[str]:
        """The tenants a request of which arrived after `since` (here; `SharedRates`: anywhere)."""
        self._asked = {t: at for t, at in self._asked.items() if at > since}
        return set(self._asked)

    def last(self, tenant: str) -> float:
        """When `tenant` was last admitted (-inf: never, or long enough ago to be forgotten)."""
        return self._last.get(tenant, -math.inf)

    def rate(self, tenant: str, now: float) -> float:
        return self._admitted.value(tenant, now) * math.log(2) / self.halflife_s

    def rates(self, now: float) -> dict[str, float]:
        """This router's admitted rates (its drain rate)."""
        out = self._admitted.rates(now)
        self._last = {t: v for t, v in self._last.items() if t in out}  # `out` holds rates above FORGET only
        return out

    def shares(self, now: float) -> dict[str, float]:
        """The admitted rates weighted shares are judged by: this router's own (fleet_share.py
        `SharedRates` has the fleet's)."""
        return self.rates(now)

    def demands(self, now: float) -> dict[str, float]:
        """The arrival rates weighted shares are judged by (the fleet's with `SharedRates`)."""
        return self._arrived.rates(now)


def water_level(weights: Mapping[str, float], demand: Mapping[str, float], capacity: float) -> float:
    """L with sum over `demand`'s tenants of min(demand, L x weight) = `capacity` (weights default 1);
    infinite when the demand does not fill the capacity."""
    if sum(demand.values()) <= capacity:
        return math.inf
    weight = {t: weights.get(t, 1.0) for t in demand}
    left, wsum = capacity, sum(weight.values())
    for tenant in sorted(demand, key=lambda t: demand[t] / weight[t]):
        level = left / wsum
        if demand[tenant] / weight[tenant] > level:
            return level
        left, wsum = left - demand[tenant], wsum - weight[tenant]
    return math.inf  # not reached: the demand exceeds the capacity


def _fair(weights: Mapping[str, float], rates: Mapping[str, float],
          demand: Mapping[str, float] | None) -> tuple[dict[str, float], float]:
    """(what each tenant wants, the water level) for the admitted `rates` and the `demand`."""
    total = sum(rates.values())
    if demand is None:
        wants = {t: math.inf for t, r in rates.items() if r > ACTIVE * total}
    else:  # what a tenant was admitted it asked for, whatever the counts' timing says
        wants = {t: max(d, rates.get(t, 0.0)) for t, d in demand.items() if d > FORGET}
        wants.update({t: r for t, r in rates.items() if t not in wants})
    return wants, water_level(weights, wants, total)


class Fair:
    """The fair shares at one instant, worked out once for every question a decision asks of them."""

    __slots__ = ("weights", "rates", "wants", "level", "total")

    def __init__(self, weights: Mapping[str, float], rates: Mapping[str, float],
                 demand: Mapping[str, float] | None = None) -> None:
        self.weights, self.rates = weights, rates
        self.total = sum(rates.values())
        self.wants, self.level = _fair(weights, rates, demand)

    def share(self, tenant: str) -> float:
        return self.level * self.weights.get(tenant, 1.0)

    def over_share(self, tenant: str, tolerance: float = TOLERANCE) -> bool:
        """`tenant` was admitted more than its weighted fair share of what the fleet admitted lately.
        Without demand counts every tenant admitted lately wants more than it gets (plain weighted
        shares among them). Alone, a tenant is never over."""
        if self.total <= 0 or len(self.wants | {tenant: 0.0}) < 2:
            return False
        return self.rates.get(tenant, 0.0) > self.share(tenant) * (1.0 + tolerance)

    def held_back(self, tenant: str, recent: Collection[str]) -> bool:
        """`tenant` is over its fair share while another tenant that gets less than its due (what it
        asks, up to its own share) asked lately (`recent`: it will take the slot), and one of the two
        clearly so: `tenant` past (1 + TOLERANCE) x its share, or the other below (1 - SHORT) x its due
        (a quiet tenant's shortfall is a sliver of a flood's share; neither side's is the odd refusal of
        a burst). A tenant whose demand has stopped (the counts still remember it) holds nobody back:
        the fleet stays work-conserving."""
        if self.total <= 0 or tenant not in self.rates:
            return False
        share, mine = self.share(tenant), self.rates[tenant]
        if mine <= share:
            return False
        for u in recent:
            due = min(self.wants.get(u, 0.0), self.share(u))
            got = self.rates.get(u, 0.0)
            if u != tenant and got < due and (mine > share * (1.0 + TOLERANCE) or got < due * (1.0 - SHORT)):
                return True
        return False

    def light(self, tenant: str) -> bool:
        """The fleet is contended (the demand exceeds what it admits) and `tenant` was admitted at most
        LIGHT x its weighted share: it would be the fair queue's first, so it need not wait for the
        engines to drain to the threshold (admission.py `on_arrival`); it cannot wait long among floods."""
        return math.isfinite(self.level) and self.rates.get(tenant, 0.0) <= LIGHT * self.share(tenant)


def over_share(tenant: str, weights: Mapping[str, float], rates: Mapping[str, float],
               demand: Mapping[str, float] | None = None, tolerance: float = TOLERANCE) -> bool:
    """`Fair.over_share` for one question (`demand` None: plain weighted shares)."""
    return Fair(weights, rates, demand).over_share(tenant, tolerance)


def held_back(tenant: str, weights: Mapping[str, float], rates: Mapping[str, float], demand: Mapping[str, float],
              recent: Collection[str]) -> bool:
    """`Fair.held_back` for one question."""
    return Fair(weights, rates, demand).held_back(tenant, recent)
