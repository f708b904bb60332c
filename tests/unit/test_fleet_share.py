"""Admission shared by router replicas (router/decision/fleet_share.py, leases.py, fleet_ledger.py),
on a virtual clock with the memory ledger: what each replica admits from what it knows, synced."""

import random

import pytest

from kvroute.router.decision import admission as adm
from kvroute.router.decision import shares
from kvroute.router.decision.fair_queue import FairQueue
from kvroute.router.decision.fleet_ledger import FleetLedger
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.decision.tenants import TenantSpec

CONFIG = adm.AdmissionConfig(slo_ttft_s=0.5)
SYNC_S = 0.05


class Fleet:
    """`n` replicas and one ledger; `advance(t)` runs every sync due by t (the replicas out of phase)."""

    def __init__(self, n: int = 2) -> None:
        self.ledger = FleetLedger()
        self.replicas = [FleetShare(f"r{i}", CONFIG, SYNC_S, replicas=n) for i in range(n)]
        self.queues = [FairQueue(CONFIG.bands, r.tags) for r in self.replicas]
        self.next = [i * SYNC_S / n for i in range(n)]

    def advance(self, now: float) -> None:
        while min(self.next) <= now:
            i = self.next.index(min(self.next))
            at, share = self.next[i], self.replicas[i]
            share.apply(self.ledger.sync(share.request(at, self.queues[i].head_tags(), {}), at), at)
            self.next[i] += SYNC_S


def flood(fleet: Fleet, spec: TenantSpec, offered_rps: float, seconds: float, hold_s: float = 0.3,
          seed: int = 1) -> tuple[int, int]:
    """Requests of `spec` spread at random over the replicas: (admitted, peak in flight over the fleet)."""
    rng = random.Random(seed)
    now, admitted, peak, ends = 0.0, 0, 0, []
    while now < seconds:
        now += rng.expovariate(offered_rps)
        fleet.advance(now)
        while ends and ends[0][0] <= now:
            fleet.replicas[ends.pop(0)[1]].limits.finished(spec.name)
        i = rng.randrange(len(fleet.replicas))
        limits = fleet.replicas[i].limits
        if limits.check(spec, now) is None:
            limits.take(spec, now)
            admitted += 1
            ends.append((now + hold_s, i))
            ends.sort()
            peak = max(peak, len(ends))
        else:
            limits.refused(spec, now)
    return admitted, peak


def test_a_rate_limit_holds_over_the_fleet_and_is_used_whole():
    spec = TenantSpec(name="A", rate=20.0)
    admitted, _ = flood(Fleet(2), spec, offered_rps=200.0, seconds=60.0)
    most = 20.0 * 60 + 20.0  # rate x time + burst
    assert admitted <= most * 1.01
    assert admitted >= 0.95 * 20.0 * 60  # and the leases leave little unused


def test_local_limits_would_have_admitted_twice_the_rate():
    """The control: two replicas that do not share admit the tenant's rate each (divided by 1)."""
    fleet = Fleet(2)
    for share in fleet.replicas:
        share.limits.replicas = 1
    fleet.advance = lambda now: None  # never synced
    admitted, _ = flood(fleet, TenantSpec(name="A", rate=20.0), offered_rps=200.0, seconds=30.0)
    assert admitted > 1.8 * 20.0 * 30


def test_concurrency_holds_over_the_fleet_within_one_slot_per_extra_replica():
    spec = TenantSpec(name="A", max_concurrency=5)
    admitted, peak = flood(Fleet(2), spec, offered_rps=200.0, seconds=30.0, hold_s=0.3)
    assert peak <= 5 + 1
    assert admitted >= 0.9 * 30.0 * 5 / 0.3  # slots barely idle


def test_a_quiet_tenants_first_request_goes_without_waiting_for_a_lease():
    fleet = Fleet(2)
    fleet.advance(1.0)
    spec = TenantSpec(name="Q", rate=1.0, max_concurrency=1)
    limits = fleet.replicas[1].limits
    assert limits.check(spec, 1.0) is None  # never leased anything: one may go ahead of the lease
    limits.take(spec, 1.0)
    assert limits.check(spec, 1.0) == "concurrency"
    limits.finished("Q")
    fleet.advance(1.2)
    assert limits.check(spec, 1.2) == "rate_limit"  # its one token was spent; the bucket is empty
    fleet.advance(2.3)
    assert limits.check(spec, 2.3) is None


def test_a_lost_ledger_leaves_each_replica_its_share_of_the_limits():
    fleet = Fleet(2)
    fleet.advance(0.2)
    share = fleet.replicas[0]
    assert share.shared and share.replicas == 2
    share.lost()
    assert not share.shared
    spec = TenantSpec(name="A", rate=10.0, burst=10.0, max_concurrency=4)
    taken = 0
    while share.limits.check(spec, 1.0) is None:
        share.limits.take(spec, 1.0)
        taken += 1
    assert taken == 2  # max_concurrency 4 over 2 replicas (the burst of 5 is not reached)
    assert share.limits.inflight["A"] == 2


def test_weighted_shares_are_judged_by_what_the_whole_fleet_admitted():
    fleet = Fleet(2)
    one, two = fleet.replicas
    for k in range(40):
        one.rates.add("A", 0.01 * k)
    two.rates.add("B", 0.4)
    weights = {"A": 1.0, "B": 1.0}
    assert not shares.over_share("A", weights, one.rates.shares(0.4))  # alone here (not synced yet)
    fleet.advance(0.45)
    assert shares.over_share("A", weights, two.rates.shares(0.45))  # the fleet admitted A 40 times, B once
    assert not shares.over_share("B", weights, two.rates.shares(0.45))
    assert two.rates.rates(0.45)["B"] > 0 and "A" not in two.rates.rates(0.45)  # the drain rate stays its own


def test_a_tenants_tag_follows_what_it_has_queued_anywhere():
    fleet = Fleet(2)
    q1, q2 = fleet.queues
    for _ in range(6):
        q1.push(tenant="B", band=1, weight=1.0, arrived=0.0, item=None)
    fleet.advance(0.1)
    b = q2.push(tenant="B", band=1, weight=1.0, arrived=0.1, item=None)
    a = q2.push(tenant="A", band=1, weight=1.0, arrived=0.1, item=None)
    assert b.tag == pytest.approx(a.tag + 6)  # behind B's six entries on replica 1, A's first is not
    assert q2.head() is a


def test_a_head_waits_while_the_other_replicas_hold_entries_well_before_it():
    fleet = Fleet(2)
    q1, q2 = fleet.queues
    for _ in range(6):
        q2.remove(q2.push(tenant="B", band=1, weight=1.0, arrived=0.0, item=None), served=True)
    q1.push(tenant="A", band=1, weight=4.0, arrived=0.0, item=None)
    fleet.advance(0.1)
    b = q2.push(tenant="B", band=1, weight=1.0, arrived=0.1, item=None)
    assert not q2.in_turn("B", 1, 1.0, b)  # replica 1's head (A) is far before it
    ask = adm.Ask(tenant="B", band=1, weight=1.0, slo_s=0.5, arrived=0.1, predicted_s=0.01)
    assert adm.on_head(CONFIG, ask, 0.1, in_turn=False).reason == "fleet_turn"
    head = q1.head()
    q1.remove(head, served=True)
    fleet.advance(0.2)
    assert q2.in_turn("B", 1, 1.0, b)  # replica 1's queue is empty: B's turn


def test_a_band_idle_over_the_whole_fleet_forgets_its_tags():
    fleet = Fleet(2)
    q1, q2 = fleet.queues
    entries = [q1.push(tenant="B", band=1, weight=1.0, arrived=0.0, item=None) for _ in range(5)]
    fleet.advance(0.1)
    for entry in entries:
        q1.remove(entry)  # refused, not served: the band's virtual time stays
    fleet.advance(0.2)
    a = q2.push(tenant="A", band=1, weight=1.0, arrived=0.2, item=None)
    b = q2.push(tenant="B", band=1, weight=1.0, arrived=0.2, item=None)
    assert b.tag == pytest.approx(a.tag)  # B starts afresh from the band's virtual time, as A does


def test_a_failed_sync_carries_its_news_to_the_next():
    fleet = Fleet(2)
    one, two = fleet.replicas
    for k in range(10):
        one.rates.add("A", 0.01 * k)
    one.request(0.1, {}, {})
    one.failed()  # the reply never came
    fleet.advance(0.3)
    assert two.rates.shares(0.3)["A"] == pytest.approx(one.rates.shares(0.3)["A"], rel=0.05)
