"""Shared admission on live traffic: this process's `FleetShare` synced with the Redis ledger.

With `--redis URL` (and `--admission-sync-s` > 0, 0.05 by default) every router replica and
every `--workers` process admits by the fleet's state (router/decision/fleet_share.py): one
background task syncs every interval, one round trip (router/service/admission_store.py),
never on a request's path. After each sync it hands every instance the other replicas'
charges (`Instance.peer_charges`) and pokes the admission gate (the fleet's queues moved).

Lost Redis. After `failures` syncs in a row fail (down, or slower than the timeout), the
process admits locally: its own rates and virtual time, each tenant's limits divided by the
replicas last known (router/decision/leases.py), and says so: one log line, the gauge
`kvroute_router_admission_shared` at 0, `/health`'s `admission` section; it keeps trying every
interval, and the first sync that works restores the shared state (one log line). Nothing
admitted or queued is dropped either way.

    kvroute_router_admission_shared            1 while admission is shared through Redis
    kvroute_router_admission_replicas          router processes sharing it, as last synced
    kvroute_router_admission_sync_seconds      a sync's round trip
    kvroute_router_admission_sync_failures_total
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvroute.router.decision.base import NO_PEER_LOAD, PeerLoad
from kvroute.router.decision.fleet_ledger import SyncReply, SyncRequest
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.service.admission_store import LedgerUnavailable

log = logging.getLogger(__name__)

SYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class Charged(Protocol):
    """An instance as shared admission sees it (router/fleet/instance.py `Instance`)."""

    id: str
    inflight: int
    queued_prefill_tokens: int
    peer_charges: PeerLoad


class Ledger(Protocol):
    async def sync(self, request: SyncRequest) -> SyncReply: ...

    async def close(self) -> None: ...


def replica_id() -> str:
    """This process's name in the ledger: host, pid and a random part (a restart is a new replica)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class SharedAdmission:
    def __init__(self, share: FleetShare, ledger: Ledger, instances: Callable[[], Iterable[Charged]],
                 heads: Callable[[], dict[int, float]], poke: Callable[[], None],
                 registry: CollectorRegistry | None = None, failures: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`instances`: the fleet's instances now; `heads`: the admission queue's head tag per band;
        `poke`: wake the admission queue's head."""
        self.share, self.ledger, self.instances, self.heads, self.poke = share, ledger, instances, heads, poke
        self.failures, self.clock = failures, clock
        self.consecutive = 0
        self.reason: str | None = "not synced yet"  # why admission is local (None: shared)
        self.since = clock()
        registry = registry or CollectorRegistry()
        self._shared = Gauge("kvroute_router_admission_shared", "1 while admission is shared through Redis.",
                             registry=registry)
        self._replicas = Gauge("kvroute_router_admission_replicas", "Router processes sharing admission.",
                               registry=registry)
        self._seconds = Histogram("kvroute_router_admission_sync_seconds", "Round trip of one admission sync.",
                                  buckets=SYNC_BUCKETS, registry=registry)
        self._failed = Counter("kvroute_router_admission_sync_failures", "Admission syncs that failed.",
                               registry=registry)
        self._replicas.set(share.replicas)

    async def run(self) -> None:
        while True:
            started = self.clock()
            await self.sync_once()
            await asyncio.sleep(max(0.0, self.share.sync_s - (self.clock() - started)))

    async def sync_once(self) -> bool:
        """One sync; False when it failed."""
        instances = list(self.instances())
        load = {i.id: PeerLoad(queued=max(0, i.queued_prefill_tokens), inflight=i.inflight) for i in instances
                if i.inflight or i.queued_prefill_tokens > 0}
        request = self.share.request(self.clock(), self.heads(), load)
        t0 = time.perf_counter()
        try:
            reply = await self.ledger.sync(request)
        except LedgerUnavailable as e:
            self._failed.inc()
            self.consecutive += 1
            self.share.failed()
            if self.consecutive == self.failures:
                self._lose(instances, str(e))
            return False
        self._seconds.observe(time.perf_counter() - t0)
        self.consecutive = 0
        self.share.apply(reply, self.clock())
        for inst in instances:
            inst.peer_charges = reply.load.get(inst.id, NO_PEER_LOAD)
        if self.reason is not None:
            if self.reason != "not synced yet":
                log.warning("shared admission restored: %d router processes share it again", reply.replicas)
            self.reason, self.since = None, self.clock()
            self._shared.set(1)
        self._replicas.set(reply.replicas)
        self.poke()
        return True

    def _lose(self, instances: list[Charged], why: str) -> None:
        self.share.lost()
        for inst in instances:
            inst.peer_charges = NO_PEER_LOAD
        self.reason, self.since = f"Redis unreachable: {why}", self.clock()
        self._shared.set(0)
        log.warning("shared admission lost after %d failed syncs (%s): admitting locally, each tenant's limits "
                    "divided by the %d router processes last known", self.consecutive, why, self.share.replicas)
        self.poke()

    def health(self) -> dict:
        out = {"mode": "shared" if self.reason is None else "local", "replicas": self.share.replicas,
               "since_s": round(self.clock() - self.since, 3)}
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    async def close(self) -> None:
        await self.ledger.close()
