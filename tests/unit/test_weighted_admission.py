"""Weighted fair shares in the admission decision (router/decision/shares.py, admission.py `held_back`),
on a virtual clock: a toy fleet that frees capacity in real time, floods that arrive faster than it,
one router or two replicas syncing through the memory ledger."""

import itertools
import math

import pytest

from kvroute.router.decision import admission as adm
from kvroute.router.decision import shares
from kvroute.router.decision.fair_queue import FairQueue
from kvroute.router.decision.fleet_ledger import FleetLedger
from kvroute.router.decision.fleet_share import FleetShare

CONFIG = adm.AdmissionConfig(slo_ttft_s=0.5)  # the engines may hold 0.3 s of predicted TTFT
WEIGHTS = {"A": 4.0, "B": 1.0, "Q": 1.0, "N": 1.0}
STEP_S, WORK_S, PREFILL_S, SYNC_S = 0.005, 0.04, 0.02, 0.05  # the fleet serves 25 req/s


class Router:
    """One router's admission: its queue and rates (a `FleetShare`'s when shared)."""

    def __init__(self, share: FleetShare | None = None) -> None:
        self.share = share
        self.queue = FairQueue(CONFIG.bands, share.tags if share is not None else None)
        self.rates = share.rates if share is not None else shares.Rates(CONFIG.drain_halflife_s)
        self.refused: list[tuple[float, str, str]] = []  # (when, tenant, reason)

    def arrive(self, tenant: str, backlog_s: float, now: float) -> bool:
        """Admitted at once, or not (queued or refused: the toy fleet never serves its queue)."""
        self.rates.arrived(tenant, now)
        ask = adm.Ask(tenant=tenant, band=1, weight=WEIGHTS[tenant], slo_s=0.5, arrived=now,
                      predicted_s=backlog_s + PREFILL_S, prefill_s=PREFILL_S)
        verdict = adm.on_arrival(CONFIG, ask, self.queue, self.rates, WEIGHTS, now)
        if verdict.action != adm.ADMIT:
            if verdict.action == adm.REFUSE:
                self.refused.append((now, tenant, verdict.reason))
            return False
        self.queue.passed(tenant, 1, WEIGHTS[tenant])
        self.rates.add(tenant, now)
        return True


def run(routers, sends, seconds=20.0, since=0.0):
    """`sends`: per tenant, (router index, requests per second, start, stop). The fleet's backlog
    (seconds of predicted wait) grows by WORK_S per admission and drains in real time. Returns the
    requests admitted per tenant from `since` on."""
    ledger, backlog, admitted = FleetLedger(), 0.0, dict.fromkeys(sends, 0)
    next_at = {t: start for t, (_, _, start, _) in sends.items()}
    for k in itertools.count():
        now = k * STEP_S
        if now >= seconds:
            return admitted
        backlog = max(0.0, backlog - STEP_S)
        for i, router in enumerate(routers):
            if router.share is not None and k % round(SYNC_S / STEP_S) == i:  # out of phase
                share = router.share
                share.apply(ledger.sync(share.request(now, router.queue.head_tags(), {}), now), now)
        for tenant, (i, rps, _, stop) in sends.items():
            while next_at[tenant] <= now < stop:
                next_at[tenant] += 1.0 / rps
                if routers[i].arrive(tenant, backlog, now):
                    backlog += WORK_S
                    admitted[tenant] += now >= since


def two_replicas():
    return [Router(FleetShare(f"r{i}", CONFIG, SYNC_S, replicas=2)) for i in range(2)]


def test_the_water_level_gives_a_tenant_what_it_asks_up_to_its_weighted_share():
    assert shares.water_level({}, {"A": 5.0, "B": 5.0}, 20.0) == math.inf  # the demand fits: no level
    assert shares.water_level(WEIGHTS, {"A": 100.0, "B": 100.0}, 25.0) == pytest.approx(5.0)  # 20 : 5
    # Q asks 3, less than its share: it gets 3, N the rest
    assert shares.water_level(WEIGHTS, {"Q": 3.0, "N": 100.0}, 25.0) == pytest.approx(22.0)


def test_over_share_is_judged_among_the_tenants_that_ask():
    flood = {"A": 24.0, "B": 24.0}
    assert shares.over_share("B", WEIGHTS, {"A": 15.0, "B": 10.0}, flood)
    assert not shares.over_share("A", WEIGHTS, {"A": 15.0, "B": 10.0}, flood)
    # B gets all that A does not ask for: over no share (work-conserving)
    assert not shares.over_share("B", WEIGHTS, {"A": 5.0, "B": 20.0}, {"A": 5.0, "B": 24.0})
    assert not shares.over_share("B", WEIGHTS, {"B": 25.0}, {"B": 40.0})  # alone


def test_held_back_only_for_a_tenant_short_of_its_due_that_asked_lately():
    got, asked = {"A": 15.0, "B": 10.0}, {"A": 24.0, "B": 24.0}
    assert shares.held_back("B", WEIGHTS, got, asked, recent={"A", "B"})
    # A's counts remember a demand, but A sent nothing lately: nobody takes B's slot, B goes
    assert not shares.held_back("B", WEIGHTS, got, asked, recent={"B"})
    # a quiet tenant refused once (2.7 of the 3 it asks) holds the flood back, however small its part
    assert shares.held_back("N", WEIGHTS, {"Q": 2.7, "N": 22.3}, {"Q": 3.0, "N": 48.0}, recent={"Q"})
    assert not shares.held_back("N", WEIGHTS, {"Q": 3.0, "N": 22.0}, {"Q": 3.0, "N": 48.0}, recent={"Q"})
    # the odd refusal in a burst on both sides is no imbalance
    assert not shares.held_back("B", WEIGHTS, {"A": 19.6, "B": 5.1}, {"A": 20.0, "B": 24.0}, recent={"A"})


def test_one_router_admits_two_floods_by_their_weights():
    # each flood alone would take the whole fleet; arriving together they would get 1:1 first come,
    # first served (the queue holds almost nothing: an arrival that cannot be served in time is refused)
    got = run([Router()], {"A": (0, 50.0, 0.0, 20.0), "B": (0, 50.0, 0.002, 20.0)}, since=3.0)
    assert 3.6 <= got["A"] / got["B"] <= 4.4
    assert got["A"] + got["B"] >= 0.95 * 25.0 * 17  # the fleet stays full


def test_two_replicas_that_each_see_one_tenant_hold_the_weights_through_the_ledger():
    got = run(two_replicas(), {"A": (0, 50.0, 0.0, 20.0), "B": (1, 50.0, 0.002, 20.0)}, since=3.0)
    assert 3.2 <= got["A"] / got["B"] <= 4.8
    assert got["A"] + got["B"] >= 0.95 * 25.0 * 17


def test_a_tenant_that_stops_holds_nobody_back():
    # B floods until 8 s; A takes the whole fleet from then on, and none of its requests is refused
    # for B's share: the counts remember B's demand for seconds, but B asked nothing lately
    router = Router()
    got = run([router], {"A": (0, 50.0, 0.0, 20.0), "B": (0, 50.0, 0.002, 8.0)}, since=9.0)
    assert got["A"] >= 0.95 * 25.0 * 11
    assert [r for r in router.refused if r[0] >= 8.0 + CONFIG.recent_s and r[2] == "over_share"] == []
    assert any(r[1] == "B" and r[2] == "over_share" for r in router.refused)  # while both flooded


def test_a_quiet_tenant_below_its_share_is_never_refused_for_the_flood():
    sends = {"Q": (0, 2.0, 0.0, 20.0), "N": (1, 60.0, 0.001, 20.0)}
    synced, alone = two_replicas(), [Router(), Router()]
    shared, apart = run(synced, sends), run(alone, sends)
    assert shared["Q"] == 40  # every one admitted at once: light, as the fleet's counts show
    assert not any(r[1] == "Q" and r[2] == "over_share" for router in synced + alone for r in router.refused)
    # each replica alone: Q's does not know another tenant floods the engines, so Q is not light there
    # and waits for the engines to drain like anyone (what sharing the counts buys)
    assert apart["Q"] < 40
    assert min(shared["N"], apart["N"]) >= 0.9 * 25.0 * 20


def test_a_light_tenants_queued_request_goes_once_it_fits_its_budget():
    ask = adm.Ask(tenant="Q", band=1, weight=1.0, slo_s=0.5, arrived=0.0, predicted_s=0.4, prefill_s=0.02)
    assert adm.on_head(CONFIG, ask, now=0.05, last_admitted=0.0).action == adm.WAIT  # past the 0.3 s threshold
    light = adm.on_head(CONFIG, ask, now=0.05, last_admitted=0.0, in_turn=False, light=True)
    assert light.action == adm.ADMIT and light.reason == "light"
    late = adm.on_head(CONFIG, ask, now=0.2, last_admitted=0.0, light=True)  # its budget is 0.3 s now
    assert late.action == adm.REFUSE and late.reason == "deadline"
