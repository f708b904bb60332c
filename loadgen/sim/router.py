"""The simulated router: the real index and policy, driven by the cluster's callbacks.

Per arrival: hash the prompt's blocks (router/contract/protocol.py), look them up in the
real `MemoryIndex` (sync methods), then the router's own decision (router/decision/route.py
`RouteDecision`: candidates, policy select, `on_routed` and the recent sender) on the
`LoadView`'s groups, and dispatch as router/service/proxy.py does: +1 inflight and the
predicted uncached tokens queued; at the first token `on_first_token` with the
TTFT and those tokens, which leave the queue; at the end `on_finished`. The CPU
time of lookup + candidates + select is measured with `time.perf_counter` (real
seconds, not virtual ones). Each request yields a `loadgen.record.RequestRecord`
with the fields the load generator measures, times on the virtual clock.

With `disagg` (loadgen/sim/disagg.py) a request may run in two stages: a
prefill to its first token (TTFT, the prefill's dispatch ends there), then a
decode on another instance (a dispatch with no uncached tokens) to its end.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Mapping

from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import SamplingParams
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.sim.admission import AdmissionSetup, SimAdmission
from kvroute.loadgen.sim.cluster import ARRIVE, CALL, Cluster, KVEvents
from kvroute.loadgen.sim.disagg import Disagg, DisaggConfig
from kvroute.loadgen.sim.instance import QUEUE_FULL, SimInstance
from kvroute.loadgen.sim.load_view import LoadView
from kvroute.loadgen.sim.planning import SimWindow
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.contract.protocol import block_hashes, hash_seed
from kvroute.router.decision.base import Policy, RouteRequest
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.decision.route import Routed, RouteDecision, RouteSettings, uncached_tokens
from kvroute.router.decision.routing_loss import best_and_predicted, held_blocks
from kvroute.router.index.base import PrefixMatch, event_owner
from kvroute.router.index.memory import MemoryIndex

CONTEXT_TOO_LONG = "prompt plus max_tokens exceeds the model's context or the KV pool"


class Flight:
    """One request between dispatch and its end."""

    __slots__ = ("record", "route", "instance", "uncached", "first", "last_t", "spec_index", "prefill",
                 "max_tokens")

    def __init__(self, record: RequestRecord, route: RouteRequest, instance: int, uncached: int) -> None:
        self.record, self.route, self.instance, self.uncached = record, route, instance, uncached
        self.first = False
        self.last_t = 0.0
        self.spec_index = record.index
        self.prefill = False  # disaggregated: a prefill stage, its decode to follow
        self.max_tokens = 0  # the request's (its decode's, disaggregated; the planner's demand)


class SimRouter:
    def __init__(self, cluster: Cluster, policy: Policy, followers: dict[int, list[RequestSpec]] | None = None,
                 fast_k: int = 0, recent_ttl_s: float = 2.0, disagg: DisaggConfig | None = None,
                 window: bool = False, admission: AdmissionSetup | None = None, index: MemoryIndex | None = None,
                 share: FleetShare | None = None) -> None:
        """`index`: one shared by several replicas (loadgen/sim/replicas.py), as --index redis is; `share`:
        this replica's side of shared admission (router/decision/fleet_share.py)."""
        self.cluster = cluster
        self.policy = policy
        first = cluster.instances[0]
        self.block_size = first.config.batch.block_size
        self.model = first.runner.info.model
        self.hash_seed = hash_seed(self.model)
        self.seeds: dict[str, int] = {"": self.hash_seed}  # a LoRA adapter's chain seed (the "seeded" key rule)
        self.max_model_len = first.runner.info.max_model_len
        self.pool_tokens = first.config.batch.num_blocks * self.block_size
        self.ids = [inst.id for inst in cluster.instances]
        self.index = index if index is not None else MemoryIndex()
        self.view = LoadView(self.ids, [inst.tier_costs() for inst in cluster.instances])
        self.decision = RouteDecision(policy, RouteSettings(fast_candidates=fast_k, recent_ttl_s=recent_ttl_s))
        self.followers = followers or {}
        self.flights: dict[int, Flight] = {}
        self.records: list[RequestRecord] = []
        self.decision_s = array("d")
        self.matches: Mapping[str, PrefixMatch] = {}  # the last decision's
        self.num_candidates = 0
        self.index_peak = 0
        self._sampling: dict[int, SamplingParams] = {}
        self.disagg = Disagg(cluster, self.view, self.decision, disagg) if disagg is not None else None
        self.window = SimWindow(cluster) if window else None  # what the planner reads
        self.admission = None if admission is None or admission.config.slo_ttft_s is None else SimAdmission(
            admission, index=self.index, decision=self.decision, members=self.view.all, block_size=self.block_size,
            seed_of=self.seed_of, dispatch=self.on_arrival, record=self._refused,
            call_at=lambda at, fn: cluster.push(at, CALL, fn), share=share)

    # -- arrivals -------------------------------------------------------------------

    def on_arrival(self, spec: RequestSpec, arrived: float | None = None) -> None:
        """`arrived`: a request the admission queue held since then (loadgen/sim/admission.py)."""
        now = self.cluster.now
        if arrived is None and self.admission is not None and not self.admission.arrive(spec, now):
            return
        tokens = spec.prompt_ids
        n = len(tokens)
        if self.window is not None:
            self.window.arrived(n, spec.max_tokens)
        seed = self.seed_of(spec)
        hashes = block_hashes(tokens, self.block_size, seed)
        route = RouteRequest(num_tokens=n, block_hashes=tuple(hashes), block_size=self.block_size,
                             request_id=f"r{spec.index}", adapter=spec.adapter or None)
        routed, prefill, uncached = self.decide(route, now)
        matches = self.matches
        decision = routed.decision
        i = routed.member
        self.view.dispatched(i, uncached)
        sent = now if arrived is None else arrived
        record = RequestRecord(index=spec.index, group=spec.group, send_s=sent, planned_s=sent, prompt_tokens=n,
                               instance=decision.instance)
        if not prefill:  # the routing-loss figures, as the router's (router/decision/routing_loss.py)
            if not self.policy.uses_index and hashes:
                matches = self.index.lookup_sync(route.block_hashes)
            ids, costs = self.ids, self.view.tier_costs
            held = ((ids[c], held_blocks(ids[c], matches, costs[c])) for c in routed.candidates)
            record.best_cached_tokens, record.predicted_cached_tokens = best_and_predicted(
                held, decision.instance, n, self.block_size)
        flight = Flight(record, route, i, uncached)
        flight.prefill, flight.max_tokens = prefill, spec.max_tokens
        seq = Sequence(route.request_id, tokens, self._sampling_for(spec.max_tokens), seed, now,
                       hash_chain=hashes, adapter=route.adapter)  # the engine would hash the same tokens alike
        if prefill and spec.max_tokens > 1:
            seq.sampling, seq.pin_kv = self._sampling_for(1), True
        self.flights[seq.seq_id] = flight
        if n + spec.max_tokens > self.max_model_len or n + 1 > self.pool_tokens:
            self._end(flight, seq, CONTEXT_TOO_LONG, 400)
        elif not self.cluster.submit(i, seq):
            self._end(flight, seq, QUEUE_FULL, 429)
        if len(self.records) & 1023 == 0:
            self.index_peak = max(self.index_peak, self.index.size_sync())

    def seed_of(self, spec: RequestSpec) -> int:
        """The chain seed of `spec`'s blocks: the model's, or its adapter's (as the engine keys them)."""
        seed = self.seeds.get(spec.adapter)
        if seed is None:
            seed = self.seeds[spec.adapter] = hash_seed(self.model, None, spec.adapter)
        return seed

    def decide(self, route: RouteRequest, now: float) -> tuple[Routed, bool, int]:
        """(the decision, whether it is a disaggregated prefill, its predicted uncached tokens), recorded
        (`RouteDecision.routed`; the index's matches kept in `matches`); lookup and choice are timed, in
        real seconds."""
        t0 = time.perf_counter()
        matches = self.index.lookup_sync(route.block_hashes) if self.policy.uses_index else {}
        if self.disagg is None:
            routed, prefill = self.decision.choose(route, self.view.all(), matches, now), False
        else:
            routed, prefill = self.disagg.plan(route, matches, now)
        self.decision_s.append(time.perf_counter() - t0)
        self.num_candidates += len(routed.candidates)
        if not prefill:
            self.decision.routed(route, routed.decision.instance, now)
        uncached = uncached_tokens(routed.decision, routed.state, matches, route.num_tokens, self.block_size)
        self.matches = matches
        return routed, prefill, uncached

    def _sampling_for(self, max_tokens: int) -> SamplingParams:
        sampling = self._sampling.get(max_tokens)
        if sampling is None:
            sampling = self._sampling[max_tokens] = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return sampling

    # -- engine callbacks -------------------------------------------------------------

    def on_tokens(self, inst: SimInstance, seqs: list[Sequence]) -> None:
        now = self.cluster.now
        flights = self.flights
        for seq in seqs:
            flight = flights[seq.seq_id]
            if flight.first:
                flight.record.itl_s.append(now - flight.last_t)
            else:
                flight.first = True
                record = flight.record
                record.ttft_s = ttft = now - record.send_s
                self.view.first_token(flight.instance, flight.uncached)
                self.policy.on_first_token(flight.route, inst.id, ttft, flight.uncached)
            flight.last_t = now
            if seq.is_finished:
                if flight.prefill and seq.pin_kv:
                    self._to_decode(flight, seq, inst)
                else:
                    self._end(flight, seq, "", 200)
        if self.admission is not None:
            self.admission.poke(now)

    def _to_decode(self, flight: Flight, prefilled: Sequence, prefill: SimInstance) -> None:
        """The prefill's dispatch ends at its first token; the decode's starts (nothing to prefill)."""
        self.view.finished(flight.instance)
        self.policy.on_finished(flight.route, prefill.id)
        flight.prefill = False
        assert self.disagg is not None  # a prefill flight exists only with disaggregation
        flight.instance = decode = self.disagg.pick_decode()  # by load now, as the router does, not at arrival
        self.view.dispatched(decode, 0)
        del self.flights[prefilled.seq_id]
        prefilled.sampling = self._sampling_for(flight.max_tokens)
        seq = self.disagg.hand_off(prefilled, prefill, decode)
        self.flights[seq.seq_id] = flight

    def on_failed(self, inst: SimInstance, seq: Sequence, error: str, status: int) -> None:
        self._end(self.flights[seq.seq_id], seq, error, status)

    def _end(self, flight: Flight, seq: Sequence, error: str, status: int) -> None:
        now = self.cluster.now
        record = flight.record
        record.e2e_s = now - record.send_s
        record.status, record.error = status, error
        record.output_tokens = seq.num_generated
        record.cached_tokens = seq.num_cached
        record.cached_tokens_by_tier = dict(seq.cached_by_tier) if seq.cached_by_tier else None
        if not flight.first:
            self.view.first_token(flight.instance, flight.uncached)
        self.view.finished(flight.instance)
        self.policy.on_finished(flight.route, self.ids[flight.instance])
        del self.flights[seq.seq_id]
        self.records.append(record)
        if self.window is not None:
            self.window.finished(record, flight.max_tokens)
        for follower in self.followers.get(flight.spec_index, ()):
            self.cluster.push(now + follower.think_s, ARRIVE, follower)

    def on_kv_events(self, index: int, events: KVEvents) -> None:
        inst = self.ids[index]
        for ev in events:
            self.index.apply_sync(event_owner(inst, ev.tier, ev.store), ev.kind, ev.blocks, ev.tier)

    def on_load(self, inst: SimInstance) -> None:
        self.view.polled(inst.index, inst.load(), inst.tier_costs())
        if self.admission is not None:
            self.admission.poke(self.cluster.now)

    def _refused(self, spec: RequestSpec, record: RequestRecord) -> None:
        """Admission refused `spec`: its record, and its follow-ups as after any end."""
        self.records.append(record)
        for follower in self.followers.get(spec.index, ()):
            self.cluster.push(record.end_s + follower.think_s, ARRIVE, follower)  # end_s: send_s + e2e_s
