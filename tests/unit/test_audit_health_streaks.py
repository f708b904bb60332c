"""Failure streaks, ejection and re-admission follow their rules over any sequence of events.

Issue 36's audit planted a good health check that no longer reset the failure streak and the
whole suite passed. The rules (router/fleet/instance.py, router/fleet/cluster.py,
docs/router.md): failed probes and failed requests make two streaks, each broken only by its
own kind of success (a good probe, an answered request); a healthy instance is ejected when
either streak reaches --eject-after; one ejected for failed requests stays out for --ejection-s,
doubled for each consecutive ejection up to 16x, and an answered request ends the doubling;
an ejected instance comes back at its --readmit-after-th good probe in a row once that time is
over; slow answers never take more than half of a model's engines out, a dead one always goes; an
outage is dated from its first failure (its index entries are forgotten --index-ttl-s after).
"""

import contextlib
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.router.fleet import instance as instance_module
from kvroute.router.fleet.instance import EngineInfo, Instance
from tests.support.fleets import fleet
from tests.support.properties import PROPERTY

PROBE_FAIL, PROBE_OK, REQUEST_FAIL, REQUEST_5XX, ANSWERED = "probe_fail", "probe_ok", "request_fail", "5xx", "ok"
EVENTS = st.sampled_from([PROBE_FAIL, PROBE_OK, REQUEST_FAIL, REQUEST_5XX, ANSWERED])


@contextlib.contextmanager
def fake_clock():
    """The instance module's clock, moved by hand (`.t`)."""
    now, real = types.SimpleNamespace(t=1000.0), instance_module.time
    instance_module.time = types.SimpleNamespace(monotonic=lambda: now.t)
    try:
        yield now
    finally:
        instance_module.time = real


@pytest.fixture
def clock():
    with fake_clock() as now:
        yield now


def ready(url: str = "http://e0") -> Instance:
    inst = Instance(url)
    inst.info = EngineInfo(url.rsplit("/", 1)[-1], "m", 16, 1, "fp")
    inst.healthy = inst.reachable = True
    return inst


def apply(inst: Instance, event: str, eject_after: int, readmit_after: int, ejection_s: float = 10.0) -> bool:
    """One event; True when it ejected or re-admitted the instance."""
    if event == PROBE_OK:
        return inst.mark_success(readmit_after)
    if event == ANSWERED:
        inst.request_ok()
        return False
    return inst.mark_failure(eject_after, request=event != PROBE_FAIL, ejection_s=ejection_s,
                             exclude=event != REQUEST_5XX)


@PROPERTY
@given(eject_after=st.integers(1, 4), events=st.lists(EVENTS, max_size=40))
def test_an_instance_is_ejected_exactly_when_a_streak_reaches_eject_after(eject_after, events):
    """With re-admission out of reach, the instance is healthy exactly until one of the two streaks
    (failed probes broken by good ones, failed requests broken by answered ones) reaches eject_after."""
    inst = ready()
    probes = requests = 0
    ejected = False
    for event in events:
        if event == PROBE_FAIL:
            probes += 1
        elif event == PROBE_OK:
            probes = 0
        elif event == ANSWERED:
            requests = 0
        else:
            requests += 1
        changed = apply(inst, event, eject_after, readmit_after=10**6)
        should = not ejected and max(probes, requests) >= eject_after
        assert changed == should, (event, probes, requests)
        ejected = ejected or should
        assert inst.healthy == (not ejected)


@PROPERTY
@given(eject_after=st.integers(1, 4), events=st.lists(EVENTS, max_size=40))
def test_only_a_connection_failure_excludes_at_once_and_a_good_probe_brings_it_back(eject_after, events):
    """A failed probe or request excludes the instance from routing at once, a 5xx (the engine is up)
    does not; a good probe makes it reachable again. Routable = healthy and reachable."""
    inst = ready()
    reachable = True
    for event in events:
        apply(inst, event, eject_after, readmit_after=10**6)
        if event in (PROBE_FAIL, REQUEST_FAIL):
            reachable = False
        elif event == PROBE_OK:
            reachable = True
        assert inst.reachable == reachable
        assert inst.routable == (reachable and inst.healthy)


@pytest.mark.parametrize("readmit_after", [1, 2, 3, 5])
@pytest.mark.parametrize("ejections", [1, 2, 3, 5, 6, 9])
def test_an_ejected_instance_waits_out_its_doubling_ejection_then_needs_readmit_after_good_probes(
        clock, readmit_after, ejections):
    eject_after, ejection_s = 2, 10.0
    inst = ready()
    for k in range(1, ejections + 1):
        tries = 1
        while not apply(inst, REQUEST_FAIL, eject_after, readmit_after, ejection_s):
            tries += 1
            assert tries <= eject_after
        assert not inst.healthy
        length = ejection_s * 2 ** min(k - 1, 4)  # doubling, capped at 16x
        out_at = clock.t
        clock.t = out_at + length - 0.01
        for _ in range(readmit_after + 2):  # good probes while it is out: never re-admitted
            assert not apply(inst, PROBE_OK, eject_after, readmit_after) and not inst.healthy
        clock.t = out_at + length
        apply(inst, REQUEST_FAIL, eject_after, readmit_after, ejection_s)  # excluded again: the count restarts
        back = [apply(inst, PROBE_OK, eject_after, readmit_after) for _ in range(readmit_after + 1)]
        assert back == [False] * (readmit_after - 1) + [True, False], k
        assert inst.routable


@pytest.mark.parametrize("answered_between", [True, False])
def test_an_answered_request_ends_the_doubling(clock, answered_between):
    inst = ready()
    for round_ in range(4):
        assert apply(inst, REQUEST_FAIL, 1, 1, 10.0)
        length = inst.ejected_until - clock.t
        assert length == (10.0 if answered_between else 10.0 * 2 ** round_)
        clock.t = inst.ejected_until
        assert apply(inst, PROBE_OK, 1, 1)
        if answered_between:
            apply(inst, ANSWERED, 1, 1)


def test_probe_ejections_have_no_waiting_time(clock):
    """Ejected by failed probes (the engine is down), an instance is back at its readmit_after-th
    good probe: there is no ejection time to wait out."""
    inst = ready()
    for _ in range(3):
        apply(inst, PROBE_FAIL, 3, 2)
    assert not inst.healthy
    assert [apply(inst, PROBE_OK, 3, 2) for _ in range(2)] == [False, True]


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("kind", ["slow probe", "failed request"])
def test_slow_answers_take_out_at_most_half_of_a_models_engines(n, kind):
    cluster = fleet(n, eject_after=1)
    for inst in cluster.instances:
        cluster.report_failure(inst, "timed out", request=kind == "failed request", slow=kind == "slow probe")
    assert sum(not i.routable for i in cluster.instances) == n // 2


@pytest.mark.parametrize("n", range(1, 6))
def test_the_half_is_counted_per_role_and_dead_engines_always_go(n):
    cluster = fleet(2 * n, roles=("prefill", "decode"), eject_after=1)
    for inst in cluster.instances:
        cluster.report_failure(inst, "timed out", slow=True)
    out = [i for i in cluster.instances if not i.routable]
    assert sum(i.info.role == "prefill" for i in out) == sum(i.info.role == "decode" for i in out) == n // 2
    for inst in cluster.instances:
        cluster.report_failure(inst, "connection refused")  # cannot connect: dead, never capped
    assert not any(i.routable for i in cluster.instances)


@PROPERTY
@given(events=st.lists(st.tuples(EVENTS, st.floats(0.0, 5.0)), max_size=30))
def test_an_outage_is_dated_from_its_first_excluding_failure(events):
    """`down_since` (how long an instance has been unreachable: after --index-ttl-s its index entries
    are forgotten) is the time of the first failure that excluded it since it was last reachable;
    later failures keep it, a 5xx (the engine is up) does not start one, a good probe ends it."""
    with fake_clock() as now:
        inst, since = ready(), None
        for event, wait in events:
            now.t += wait
            apply(inst, event, eject_after=3, readmit_after=2)
            if event in (PROBE_FAIL, REQUEST_FAIL) and since is None:
                since = now.t
            elif event == PROBE_OK:
                since = None
            assert inst.down_since == since
