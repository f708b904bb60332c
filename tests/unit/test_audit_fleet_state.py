"""What the router knows of each instance follows every change: groups, load, queued prefill.

router/fleet: every field that decides routability (health, reachability, draining, role, removal)
regroups the fleet; every charge (a request sent or ended, its prompt tokens queued or released)
reaches the state a policy reads and the least-loaded order; with other router workers, the
engine's own queue counts too; a load report releases exactly the non-streamed requests whose
prefill the engine's own queue shows done (router/fleet/queued_prefill.py).
"""

import dataclasses
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.fleet.queued_prefill import QueuedPrefill
from tests.support.fleets import fleet
from tests.support.properties import PROPERTY


def load(draining: bool = False, role: str = "") -> LoadRecord:
    return LoadRecord(instance="e0", running=0, waiting=0, kv_used_blocks=0, kv_total_blocks=8,
                      queued_prefill_tokens=0, state="draining" if draining else "ready", role=role)


CHANGES = {  # how each routing fact goes out and comes back
    "unhealthy": (lambda i: setattr(i, "healthy", False), lambda i: setattr(i, "healthy", True)),
    "unreachable": (lambda i: setattr(i, "reachable", False), lambda i: setattr(i, "reachable", True)),
    "draining (health check)": (lambda i: setattr(i, "draining", True), lambda i: setattr(i, "draining", False)),
    "draining (load report)": (lambda i: i.observe_load(load(draining=True)), lambda i: i.observe_load(load())),
    "role (load report)": (lambda i: i.observe_load(load(role="prefill")), lambda i: i.observe_load(load(role="both"))),
    "role (registry)": (lambda i: setattr(i, "info", dataclasses.replace(i.info, role="decode")),
                        lambda i: setattr(i, "info", dataclasses.replace(i.info, role="both"))),
}


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_every_routing_change_regroups_the_fleet(change, which):
    cluster = fleet(3)
    out, back = CHANGES[change]
    everyone = ["e0", "e1", "e2"]
    assert [i.id for i in cluster.group("m", ("both",)).members] == everyone
    out(cluster.instances[which])
    assert [i.id for i in cluster.group("m", ("both",)).members] == [e for e in everyone if e != f"e{which}"]
    assert [i.id for i in cluster.routable("m", ("both",))] == [e for e in everyone if e != f"e{which}"]
    back(cluster.instances[which])
    assert [i.id for i in cluster.group("m", ("both",)).members] == everyone


charges = st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 1), st.integers(-50, 200)), max_size=40)


@PROPERTY
@given(ops=charges)
def test_every_charge_reaches_the_policys_view_and_the_least_loaded_order(ops):
    cluster = fleet(3)
    group = cluster.group("m")
    inflight, queued = [0, 0, 0], [0, 0, 0]
    for i, requests, tokens in ops:
        inst = cluster.instances[i]
        if inflight[i] + requests < 0 or queued[i] + tokens < 0:
            continue
        group.states([inst])  # the policy read the state before this change
        inst.charge(requests, tokens)
        inflight[i] += requests
        queued[i] += tokens
        for j, other in enumerate(cluster.instances):
            state = group.states([other])[0]
            assert (state.inflight, state.queued_prefill_tokens) == (inflight[j], queued[j])
        order = [inflight[cluster.instances.index(m)] for m in group.load.least(3)]
        assert order == sorted(inflight)


@PROPERTY
@given(sent=st.lists(st.tuples(st.integers(1, 400), st.floats(0.0, 10.0), st.booleans()), max_size=20),
       queued=st.integers(0, 3000), ts=st.floats(0.0, 11.0))
def test_a_load_report_releases_exactly_the_prefills_it_shows_done(sent, queued, ts):
    """Of the requests sent before the report (less the margin) and not answered, the newest ones
    whose tokens make up the engine's queue stay (the fewest that reach it), the older ones are
    released, each once; answered ones leave the queue unreleased; recent ones stay untouched."""
    q = QueuedPrefill(margin_s=0.05)
    pending = []
    for uncached, at, answered in sorted(sent, key=lambda s: s[1]):
        d = types.SimpleNamespace(uncached=uncached, first_seen=False, answered=answered)
        q.add(d, now=at)
        pending.append((at, d))
    for _, d in pending:
        d.first_seen = d.answered
    record = dataclasses.replace(load(), queued_prefill_tokens=queued, ts=ts)
    released = q.release(record)
    older = [d for at, d in pending if at <= ts - 0.05 and not d.answered]
    gone = {id(d) for d in released}
    kept = [d for d in older if id(d) not in gone]
    assert gone <= set(map(id, older)) and len(gone) == len(released)
    assert [id(d) for d in kept] == [id(d) for d in older[len(older) - len(kept):]], "kept are not the newest"
    total = sum(d.uncached for d in kept)
    assert total >= queued or kept == older
    if kept:
        assert total - kept[0].uncached < queued, "more kept than the engine's queue needs"
    assert q.release(record) == []  # each released once
    assert len(q) == len([d for at, d in pending if not d.answered]) - len(released)


@pytest.mark.parametrize("peers", [0, 1, 3])
@pytest.mark.parametrize("own,engine", [(0, 0), (100, 0), (0, 100), (100, 300), (300, 100)])
def test_with_other_router_workers_the_queue_is_the_larger_of_ours_and_the_engines(peers, own, engine):
    """Alone, a router's own charges are the prefill queued on an instance; with other workers
    (`peers`) sending there too, the engine's own report counts theirs as well: the larger one."""
    inst = Instance("http://127.0.0.1:9000", peers=peers)
    inst.info = EngineInfo("e0", "m", 16, 0, "fp")
    inst.charge(1, own)
    inst.observe_load(dataclasses.replace(load(), queued_prefill_tokens=engine))
    assert inst.state().queued_prefill_tokens == (max(own, engine) if peers else own)
