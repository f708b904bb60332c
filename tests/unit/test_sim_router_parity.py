"""The simulator's router decides as the real router does.

A simulation runs with `Twin`, the simulator's router (loadgen/sim/router.py) that feeds
everything it sees to a real `Router` (router/service/routing.py) built in process --
`Cluster` and `Instance`s set up directly, a memory index, no HTTP: every arrival, the
engines' KV events (device, host and shared-store tiers) and load reports, first tokens
and ends. At each arrival both decide; the real side's in-flight and queued-prefill
counts follow its own predictions (as router/service/proxy.py `Dispatch` does). Every
policy of the registry (random included: both sides get the same seed) must make the
same choices on both sides, with the same view of every instance's load, colocated and
disaggregated (router/service/disagg.py `Disaggregation` against loadgen/sim/disagg.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time

import pytest

from kvroute.loadgen.arrivals import ArrivalConfig
from kvroute.loadgen.sim.cluster import Cluster as SimCluster
from kvroute.loadgen.sim.disagg import Disagg, DisaggConfig
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.loadgen.sim.router import SimRouter
from kvroute.loadgen.sim.runner import SimConfig, arrivals
from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import LoadRecord, hash_seed
from kvroute.router.contract.settings_values import build
from kvroute.router.decision.base import PeerLoad, RouteRequest
from kvroute.router.decision.decode_choice import DECODE_ROLES, PREFILL_ROLES
from kvroute.router.decision.policies import POLICIES, make_policy
from kvroute.router.decision.route import RouteDecision
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import EngineInfo, Instance
from kvroute.router.index import MemoryIndex
from kvroute.router.index.base import event_owner
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.disagg import Disaggregation, pick_decode
from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.proxy import Proxy
from kvroute.router.service.request_path import RequestPath
from kvroute.router.service.request_trace import RequestTrace
from kvroute.router.service.routing import Prepared, Router

FINGERPRINT = "sim-tokenizer"


def run_now(coro):
    """Run a coroutine that never suspends (the memory index's lookup) to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the in-process router suspended")


class RealSide:
    """The real router beside the simulator's, with the proxy's in-flight accounting."""

    def __init__(self, sim: SimCluster, policy_name: str, seed: int, fast_k: int, min_uncached: int | None):
        self.model = sim.instances[0].runner.info.model
        config = RouterConfig(engines=tuple(f"http://127.0.0.1:{9000 + i.index}" for i in sim.instances),
                              fast_candidates=fast_k, recent_ttl_s=2.0)
        self.cluster = Cluster(config, MemoryIndex(), FINGERPRINT, RouterMetrics())
        for inst, simulated in zip(self.cluster.instances, sim.instances):
            inst.info = EngineInfo(simulated.id, self.model, simulated.config.batch.block_size, hash_seed(self.model),
                                   FINGERPRINT, role=simulated.role, max_model_len=simulated.runner.info.max_model_len,
                                   tier_costs=simulated.tier_costs())
            inst.healthy = inst.reachable = True
        self.cluster.check_compatibility()
        clock = lambda: sim.now  # noqa: E731
        self.policy = make_policy(policy_name, rng=random.Random(seed), clock=clock)
        self.router = Router(self.cluster, self.policy, None, RouterMetrics(), policy_name, clock=clock)
        proxy = Proxy(RequestPath(self.router, self.cluster, None), None)
        self.disagg = Disaggregation(proxy, min_uncached, random.Random(seed)) if min_uncached is not None else None
        self.by_id = {inst.id: inst for inst in self.cluster.instances}
        self.pending: dict[str, tuple[str, int]] = {}  # request id -> (instance, queued prefill tokens)

    def decide(self, route: RouteRequest) -> tuple[str, int]:
        trace = RequestTrace(model=self.model, stream=False, prompt_tokens=route.num_tokens)
        prepared = Prepared(request=None, model=self.model, num_tokens=route.num_tokens, route=route,
                            started=time.perf_counter(), trace=trace)
        choice = None
        if self.disagg is not None and self.disagg.active(self.model):
            choice = run_now(self.disagg.plan(prepared))
            roles = DECODE_ROLES
        else:
            roles = self.cluster.colocated_roles(self.model)
        if choice is None:
            choice = run_now(self.router.decide(prepared, roles=roles))
        inst, uncached = choice.instance, choice.uncached_tokens
        inst.inflight += 1
        inst.queued_prefill_tokens += uncached
        self.pending[route.request_id] = (inst.id, uncached)
        return inst.id, uncached

    def decoded(self) -> str:
        decode = pick_decode(self.cluster, self.model, self.disagg.rng)
        decode.inflight += 1
        return decode.id

    def first_token(self, route: RouteRequest) -> None:
        inst, uncached = self.pending.pop(route.request_id, (None, 0))
        if inst is not None:
            self.by_id[inst].queued_prefill_tokens -= uncached

    def finished(self, route: RouteRequest, instance: str) -> None:
        self.first_token(route)
        self.by_id[instance].inflight -= 1


class Tee:
    """The simulator's policy; its outcome hooks (first token, end) reach the real side too."""

    def __init__(self, sim, real: RealSide) -> None:
        self.sim, self.real = sim, real
        self.uses_index = sim.uses_index

    def select(self, request, candidates, matches):
        return self.sim.select(request, candidates, matches)

    def on_routed(self, request, instance):
        self.sim.on_routed(request, instance)

    def on_first_token(self, request, instance, ttft_s, uncached_tokens):
        self.sim.on_first_token(request, instance, ttft_s, uncached_tokens)
        self.real.policy.on_first_token(request, instance, ttft_s, uncached_tokens)
        self.real.first_token(request)

    def on_finished(self, request, instance):
        self.sim.on_finished(request, instance)
        self.real.policy.on_finished(request, instance)
        self.real.finished(request, instance)

    def on_failed(self, request, instance):
        self.sim.on_failed(request, instance)
        self.real.policy.on_failed(request, instance)

    def credit_detail(self, instance):
        return self.sim.credit_detail(instance)


def load_view(state) -> tuple:
    return (state.id, state.inflight, state.queued_prefill_tokens, state.running, state.waiting, state.kv_usage,
            state.kv_free_blocks, state.kv_evictable, state.tier_costs)


class Twin(SimRouter):
    def __init__(self, cluster: SimCluster, policy: Tee, real: RealSide, fast_k: int,
                 disagg: DisaggConfig | None) -> None:
        super().__init__(cluster, policy, None, fast_k, 2.0, disagg)
        self.real = real
        self.sim_choices: list[tuple[str, int]] = []
        self.real_choices: list[tuple[str, int]] = []
        self.decodes: list[tuple[str, str]] = []
        self.views_differ = 0

    def decide(self, route, now):
        group = self.view.all()
        sim_view = [load_view(s) for s in group.states(group.members)]
        real_view = [load_view(i.state()) for i in self.real.cluster.instances]
        self.views_differ += sim_view != real_view
        self.real_choices.append(self.real.decide(route))
        routed, prefill, uncached = super().decide(route, now)
        self.sim_choices.append((routed.decision.instance, uncached))
        return routed, prefill, uncached

    def _to_decode(self, flight, prefilled, prefill):
        super()._to_decode(flight, prefilled, prefill)
        self.decodes.append((self.ids[flight.instance], self.real.decoded()))

    def on_kv_events(self, index, events):
        super().on_kv_events(index, events)
        inst = self.ids[index]
        for ev in events:
            self.real.cluster.index.apply_sync(event_owner(inst, ev.tier, ev.store), ev.kind, ev.blocks, ev.tier)

    def on_load(self, inst):
        super().on_load(inst)
        load = inst.load()
        # Instance.state() dates the report on the real clocks: give it the age it has on the virtual one
        ts = time.time() + load.ts - time.monotonic()
        real = self.real.by_id[inst.id]
        tiers = advertised(inst)
        real.observe_load(dataclasses.replace(load, ts=ts, kv_tiers=tiers))
        assert real.tier_costs == inst.tier_costs()


def advertised(inst) -> dict:
    """The `kv_tiers` of the instance's GET /load, as engine/kv/tier_service.py serves it."""
    if inst.tiers is None:
        return {}
    host = inst.tiers.host
    return inst.tiers.recovery.to_wire({"blocks": host.num_slots, "used": host.num_used} if host else None)


TIERED = dict(num_blocks=160, host_blocks=256, kv_store="file:///parity-store", poll_interval_s=0.05)


def run_twins(policy_name: str, fast_k: int = 0, prefill: int = 0, perturb=None, seed: int = 3, **config):
    sim_config = build(SimConfig, instances=6, seed=seed, fast_candidates=fast_k, prefill_instances=prefill, **config)
    specs = make_workload("doc-qa", seed=seed, num_requests=240, documents=10, doc_tokens=600,
                          question_tokens=24, output_tokens=4).requests()
    cluster = SimCluster(sim_config.instances, sim_config.engine(), sim_config.event_delay_s,
                         sim_config.poll_interval_s)
    disagg = DisaggConfig(num_prefill=prefill, min_uncached=64, seed=seed) if prefill else None
    if disagg is not None:  # the roles the real side's engines advertise
        for inst in cluster.instances:
            inst.role = "prefill" if inst.index < prefill else "decode"
    real = RealSide(cluster, policy_name, seed, fast_k, 64 if prefill else None)
    sim_policy = make_policy(policy_name, rng=random.Random(seed), clock=lambda: cluster.now)
    twin = Twin(cluster, Tee(sim_policy, real), real, fast_k, disagg)
    if perturb is not None:
        perturb(twin, real)
    cluster.run(twin, iter(list(arrivals(specs, ArrivalConfig(rate=60.0), seed))))
    assert len(twin.records) == len(specs) and not twin.flights
    return twin


@pytest.mark.parametrize("policy", list(POLICIES))
def test_same_choices_colocated_with_tiers(policy):
    twin = run_twins(policy, **TIERED)
    assert twin.sim_choices == twin.real_choices
    assert twin.views_differ == 0
    assert len({inst for inst, _ in twin.sim_choices}) > 1


@pytest.mark.parametrize("policy", [name for name, cls in POLICIES.items() if cls.uses_index])
def test_same_choices_on_the_fast_path(policy):
    twin = run_twins(policy, fast_k=2, **TIERED)
    assert twin.num_candidates < 6 * len(twin.sim_choices)  # the fast path did cut candidates
    assert twin.sim_choices == twin.real_choices
    assert twin.views_differ == 0


@pytest.mark.parametrize("policy", list(POLICIES))
def test_same_prefill_and_decode_choices_disaggregated(policy):
    twin = run_twins(policy, fast_k=2, prefill=2)
    assert twin.sim_choices == twin.real_choices
    assert twin.decodes and all(sim == real for sim, real in twin.decodes)
    assert twin.views_differ == 0
    assert twin.disagg.num_transfers > 0
    assert twin.disagg.num_whole > 0 or not POLICIES[policy].uses_index  # short uncached prompts ran whole


def test_a_drift_shows():
    """Without the recent-sender record on one side the fast path's candidates differ, and so do choices."""
    def forget_senders(twin, real):
        real.router.decision.recent.record = lambda *args: None
    twin = run_twins("kv_aware", fast_k=1, perturb=forget_senders, **TIERED)
    assert twin.sim_choices != twin.real_choices


@pytest.mark.parametrize("peer", [(0, 0), (0, 2), (500, 0), (500, 2), (50, 1)])
@pytest.mark.parametrize("engine", [None, 0, 300, 900])
def test_other_replicas_charges_count_alike(peer, engine):
    """Shared admission's charges of the other router replicas (`Instance.peer_charges`, the
    simulator's `LoadView.peer_charges`) join an instance's load the same way on both sides: their
    in-flight requests added, their queued tokens added, the engine's own queue a floor once
    anyone else has a request there."""
    record = None if engine is None else LoadRecord(instance="i0", running=1, waiting=0, kv_used_blocks=0,
                                                    kv_total_blocks=8, queued_prefill_tokens=engine, ts=0.0)
    real = Instance("http://127.0.0.1:9000")
    real.info = EngineInfo("i0", "m", 16, 0, FINGERPRINT)
    real.charge(2, 400)
    real.peer_charges = PeerLoad(queued=peer[0], inflight=peer[1])
    view = LoadView(["i0"])
    view.dispatched(0, 250)
    view.dispatched(0, 150)
    view.peer_charges([PeerLoad(queued=peer[0], inflight=peer[1])])
    if record is not None:
        real.observe_load(record)
        view.polled(0, record)
    sim, state = view.state(0), real.state()
    assert (sim.inflight, sim.queued_prefill_tokens) == (state.inflight, state.queued_prefill_tokens)
    expected = 400 + peer[0] if not peer[1] or engine is None else max(400 + peer[0], engine)
    assert (state.inflight, state.queued_prefill_tokens) == (2 + peer[1], expected)


@pytest.mark.parametrize("roles", list(itertools.product(("prefill", "decode", "both"), repeat=3)))
def test_every_mix_of_roles_serves_a_request_on_the_same_engines(roles):
    """Whatever the engines' roles (the planner's changes pass through every mix), the simulator's
    `Disagg.plan` chooses among the engines the router sends the request to (router/service/entry.py,
    disagg.py): its prefill among the prefill engines while the fleet is disaggregated, a short prompt
    run whole among the decode and "both" ones then, else among the "both" engines, else among all."""
    cluster = SimCluster(3, build(SimConfig, instances=3).engine(), 0.0, 1.0)
    for inst, role in zip(cluster.instances, roles):
        inst.role = role
    real = RealSide(cluster, "round_robin", 0, 0, 64)
    view = LoadView([inst.id for inst in cluster.instances])
    route = RouteRequest(num_tokens=32, block_hashes=(), block_size=16, request_id="r")
    for min_uncached in (0, 10**6):
        disagg = Disagg(cluster, view, RouteDecision(make_policy("round_robin")),
                        DisaggConfig(num_prefill=0, min_uncached=min_uncached))
        for inst, role in zip(cluster.instances, roles):
            disagg.set_role(inst, role)
        routed, prefill = disagg.plan(route, {}, 0.0)
        if real.disagg.active(real.model):
            where = PREFILL_ROLES if min_uncached == 0 else DECODE_ROLES
        else:
            where = real.cluster.colocated_roles(real.model)
        assert prefill == (where == PREFILL_ROLES)
        assert {view.ids[i] for i in routed.candidates} == {i.id for i in real.cluster.routable(real.model, where)}
