"""Several router replicas over one simulated cluster, with admission shared or each its own.

Each replica is a whole `SimRouter` (its policy, its view of the instances' load, its admission
queue), as each `kvroute router` process is; they share one index (as `--index redis` does) and
every instance's load reports reach all of them. A request goes to the replica `assign` names
(a tenant pinned to one with `router=K`, else the replicas in turn), and stays with it.

With shared admission every replica has a `FleetShare` (router/decision/fleet_share.py), and one
`FleetLedger` (router/decision/fleet_ledger.py) stands for Redis: each replica syncs every
`sync_s` of virtual time (the replicas out of phase), so what it knows of the others is as stale
as on live traffic; after each sync it adds the others' charges to its view of the instances and
wakes its queue. Without, each replica admits alone: the comparison `kvroute sim --routers N`
reports, and `--admission-sync` shows what staleness costs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from kvroute.engine.core.sequence import Sequence as Seq
from kvroute.loadgen.sim.cluster import CALL, Cluster, KVEvents
from kvroute.loadgen.sim.instance import SimInstance
from kvroute.loadgen.sim.router import SimRouter
from kvroute.loadgen.workload_base import RequestSpec
from kvroute.router.decision.admission import AdmissionConfig
from kvroute.router.decision.base import NO_PEER_LOAD, PeerLoad, Policy
from kvroute.router.decision.fleet_ledger import FleetLedger
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.index.memory import MemoryIndex


class Replicas:
    """The cluster's `Sink` for several replicas: arrivals to the assigned one, each request's news to
    the replica that sent it, KV events to the shared index once, load reports to all."""

    def __init__(self, cluster: Cluster, replicas: Sequence[SimRouter], assign: Callable[[RequestSpec], int],
                 shares: Sequence[FleetShare | None] = (), sync_s: float = 0.05, until: float = 0.0) -> None:
        """`shares[i]`: replica i's side of shared admission (None or none given: admission alone);
        `until`: the last planned arrival (syncs stop after it once nothing is in flight or queued)."""
        self.cluster, self.replicas, self.assign = cluster, list(replicas), assign
        self.shares = list(shares) or [None] * len(self.replicas)
        self.sync_s, self.until = sync_s, until
        self.ledger = FleetLedger()
        self.syncs = 0
        for i, share in enumerate(self.shares):
            if share is not None:
                cluster.push(i * sync_s / len(self.replicas), CALL, lambda i=i: self._sync(i))

    # -- what the runner reads of a router (loadgen/sim/runner.py) --------------------

    @property
    def records(self) -> list:
        return [r for replica in self.replicas for r in replica.records]

    @property
    def flights(self) -> dict:
        return {k: v for replica in self.replicas for k, v in replica.flights.items()}

    @property
    def decision_s(self) -> array:
        return array("d", [t for replica in self.replicas for t in replica.decision_s])

    @property
    def num_candidates(self) -> int:
        return sum(replica.num_candidates for replica in self.replicas)

    @property
    def index(self) -> MemoryIndex:
        return self.replicas[0].index

    @property
    def index_peak(self) -> int:
        return max(replica.index_peak for replica in self.replicas)

    disagg = None

    def _owner(self, seq: Seq) -> SimRouter:
        return next(r for r in self.replicas if seq.seq_id in r.flights)

    def on_arrival(self, spec: RequestSpec) -> None:
        self.replicas[self.assign(spec)].on_arrival(spec)

    def on_tokens(self, inst: SimInstance, seqs: list[Seq]) -> None:
        by: dict[int, list[Seq]] = {}
        for seq in seqs:
            by.setdefault(id(self._owner(seq)), []).append(seq)
        for replica in self.replicas:
            mine = by.get(id(replica))
            if mine:
                replica.on_tokens(inst, mine)

    def on_failed(self, inst: SimInstance, seq: Seq, error: str, status: int) -> None:
        self._owner(seq).on_failed(inst, seq, error, status)

    def on_kv_events(self, index: int, events: KVEvents) -> None:
        self.replicas[0].on_kv_events(index, events)  # the index is theirs together

    def on_load(self, inst: SimInstance) -> None:
        for replica in self.replicas:
            replica.on_load(inst)

    def _busy(self) -> bool:
        return any(r.flights or (r.admission is not None and len(r.admission.queue)) for r in self.replicas)

    def _sync(self, i: int) -> None:
        now, share, replica = self.cluster.now, self.shares[i], self.replicas[i]
        assert share is not None
        view = replica.view
        load = {view.ids[k]: PeerLoad(queued=view.queued[k], inflight=view.inflight[k]) for k in range(len(view.ids))
                if view.inflight[k] or view.queued[k]}
        heads = replica.admission.queue.head_tags() if replica.admission is not None else {}
        reply = self.ledger.sync(share.request(now, heads, load), now)
        share.apply(reply, now)
        view.peer_charges([reply.load.get(inst, NO_PEER_LOAD) for inst in view.ids])
        self.syncs += 1
        if replica.admission is not None:
            replica.admission.poke(now)
        if now < self.until or self._busy():
            self.cluster.push(now + self.sync_s, CALL, lambda: self._sync(i))


def build_replicas(cluster: Cluster, n: int, make_policy: Callable[[int], Policy],
                   make_router: Callable[..., SimRouter], admission: AdmissionConfig, sync_s: float,
                   routers_of: dict[str, int], until: float) -> Replicas:
    """`n` replicas: replica i's policy `make_policy(i)`, its router `make_router(policy, index=, share=)`;
    shared admission when `sync_s` > 0; a tenant named in `routers_of` always to that replica."""
    index = MemoryIndex()
    shares = [FleetShare(f"r{i}", admission, sync_s, replicas=n) if sync_s > 0 else None for i in range(n)]
    replicas = [make_router(make_policy(i), index=index, share=shares[i]) for i in range(n)]

    def assign(spec: RequestSpec) -> int:
        tenant = spec.group.partition(":")[0] if ":" in spec.group else ""
        return routers_of.get(tenant, spec.index % n)

    return Replicas(cluster, replicas, assign, shares=shares if sync_s > 0 else (), sync_s=sync_s, until=until)
