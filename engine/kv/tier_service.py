"""The engine's I/O for its KV tiers: copy batches, store lookups, fetches and writes, tier events.

- `admit(seq, enqueue)`: when the device and host pools lack part of a prompt and
  a store is configured, one `contains_many` asks the store for the rest before
  the request is queued (`Sequence.store_hits`); a store that is down or slow
  answers "none" at once (engine/kv/store/guard.py) and the request recomputes.
- `run_copies()`, after every schedule: hands the block manager's copy batch, with the
  ahead copies (engine/kv/prestage.py), to the runner (same thread as the steps, so in
  order with them), which queues them before the step -- at most one copy per direction,
  the device-to-host one overlapping the step -- and `settle()` collects them after it:
  bytes and seconds per direction, the link estimates, the bytes recovery moved against
  the bytes it needed, the blocks read out for the store. It also starts
  fetching the store loads just admitted: one
  `get_many` per chunk (at most `FETCH_CHUNK_BYTES`) for all requests together,
  each entry checked (engine/kv/store/entry.py) before its bytes are used.
- The writer task (engine/kv/store_writes.py) drains the write queue into `put_many`
  calls off the TTFT path; this publishes `stored` events with tier "remote" and the
  store key for what it wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from kvroute.engine.core.kv_copies import CopyPlan, CopyTimes
from kvroute.engine.core.kv_events import KVChange
from kvroute.engine.core.sequence import Sequence
from kvroute.engine.core.work import RunnerInfo
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.link_estimate import DeviceCosts, describe_links
from kvroute.engine.kv.load_queue import Load
from kvroute.engine.kv.store import check_reachable, make_store
from kvroute.engine.kv.store.base import StoreUnavailable
from kvroute.engine.kv.store.entry import BadEntry, decode
from kvroute.engine.kv.store.guard import GuardedStore
from kvroute.engine.kv.store_probe import measure_store
from kvroute.engine.kv.store_writes import StoreWrites
from kvroute.engine.kv.tier_metrics import TierMetrics
from kvroute.engine.kv.tier_setup import TierSite, namespace
from kvroute.engine.kv.tiers import CacheTiers
from kvroute.router.contract.protocol import EventType

log = logging.getLogger(__name__)

FETCH_CHUNK_BYTES = 8 << 20  # bytes per store read call
MAX_FETCHES = 2  # store read calls in flight
SLOW_READ_FACTOR = 4.0  # a read may take this many times its expected transfer time (plus the read timeout)


class CopyRunner(Protocol):
    """The model runner's side of the tier copies (engine/runners: sim and torch)."""

    @property
    def payload_bytes_per_block(self) -> int: ...

    async def start_copies(self, plan: CopyPlan, ahead: CopyPlan) -> None:
        """Queue the batch before the step: its loads are in place for the step when this returns."""

    async def finish_copies(self) -> CopyTimes:
        """After the step: the batch's payloads for the store and its times."""

    def store_delay(self, num_blocks: int) -> float: ...


class CopySource(Protocol):
    """The block manager's side: the copies it planned, and what a prompt lacks locally."""

    def take_copy_plan(self) -> CopyPlan: ...

    def take_ahead_plan(self, max_fresh: int) -> CopyPlan: ...

    def missing_hashes(self, seq: Sequence) -> list[int]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class TierWiring:
    """What the tier I/O is handed: the device side, the runner, and callbacks into the engine."""

    tiers: CacheTiers
    device: CopySource
    runner: CopyRunner
    store_url: str | None
    max_fresh: int  # blocks one step may take fresh
    wake: Callable[[], None]  # new store bytes arrived: the engine loop should look
    publish: Callable[[KVChange], None]  # a change of tier "remote", for the engine's event log


class TierService:
    def __init__(self, wiring: TierWiring, store: GuardedStore | None, namespace: str, metrics: TierMetrics,
                 measure_store_timeout_s: float | None = None) -> None:
        """`measure_store_timeout_s`: measure the store's links at start (None: keep the starting figures)."""
        self.tiers, self.store, self.namespace, self.metrics = wiring.tiers, store, namespace, metrics
        self.bm, self.runner, self.wake, self.publish = wiring.device, wiring.runner, wiring.wake, wiring.publish
        self.store_url = wiring.store_url
        self.payload_bytes = wiring.runner.payload_bytes_per_block
        self.tasks: set[asyncio.Task] = set()
        self.writes = StoreWrites(store, namespace, wiring.tiers, metrics, self._written)
        self._fetch_slots = asyncio.Semaphore(MAX_FETCHES)
        self._pending: tuple[CopyPlan, CopyPlan] | None = None  # a batch started, not yet settled
        self.max_fresh = wiring.max_fresh
        self.measure_store_timeout_s = measure_store_timeout_s
        if store is not None:
            metrics.store_up.set(1)

    async def start(self) -> None:
        """Refuses to start (ValueError naming the store) when the store cannot be reached now."""
        if self.store is not None:
            assert self.store_url is not None  # the store was made from it
            await asyncio.to_thread(check_reachable, self.store_url)
            if self.measure_store_timeout_s is not None and self.payload_bytes:
                await self._measure_store()
            self._spawn(self.writes.run(), "kv-store-writer")

    async def _measure_store(self) -> None:
        assert self.store_url is not None and self.measure_store_timeout_s is not None  # start() checked them
        try:
            links = await measure_store(self.store_url, self.namespace, self.payload_bytes,
                                        self.measure_store_timeout_s)
        except Exception as e:  # noqa: BLE001 - reachable a moment ago: keep the starting figures
            log.warning("could not measure the KV store's links (%s: %s); starting from the preset figures",
                        type(e).__name__, e)
            return
        self.tiers.recovery.use_measured(links)
        log.info("KV store measured: %s", describe_links(links))

    def use_measured(self, costs: DeviceCosts, host_link: bool = True) -> None:
        """What the runner measured on its device at start-up (`host_link`: its host link figures too)."""
        self.tiers.recovery.use_measured(costs.links if host_link else {}, costs.prefill_tokens_per_s)
        log.info("device measured: %s, prefill %.0f tokens/s", describe_links(costs.links), costs.prefill_tokens_per_s)

    async def stop(self) -> None:
        if self._pending is not None:
            await asyncio.gather(self.settle(), return_exceptions=True)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.store is not None:
            await self.store.close()

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- store lookups before queueing --------------------------------------------------

    def admit(self, seq: Sequence, enqueue: Callable[[Sequence], None]) -> None:
        hashes = self.bm.missing_hashes(seq) if self.store is not None else []
        if not hashes:
            enqueue(seq)
            return
        self._spawn(self._lookup(seq, hashes, enqueue), f"kv-lookup-{seq.request_id}")

    async def _lookup(self, seq: Sequence, hashes: list[int], enqueue: Callable[[Sequence], None]) -> None:
        assert self.store is not None  # admit() looks up only with a store
        try:
            present = await self.store.contains_many(hashes)
        except StoreUnavailable:
            present = [False] * len(hashes)
        # entries the store dropped (evicted, pruned): routers stop crediting them
        hits, removed = self.tiers.looked_up(hashes, present, misses_known=self.store.up)
        self.metrics.lookups(len(hits), len(hashes) - len(hits))
        if removed is not None:
            self.publish(removed)
        seq.store_hits = hits
        if not seq.is_finished:
            enqueue(seq)

    # -- copy batches and store fetches ---------------------------------------------------

    async def run_copies(self) -> None:
        """Before the step: start this batch (with the ahead copies, which touch neither its blocks nor its
        slots), and the store fetches of the loads just admitted."""
        await self.settle()  # a batch started while the engine was idle
        plan = self.bm.take_copy_plan()
        ahead = self.bm.take_ahead_plan(self.max_fresh)
        if plan or ahead:
            self._pending = (plan, ahead)
            await self.runner.start_copies(plan, ahead)
        self.metrics.observe_recovery(self.tiers.recovery.runs, self.tiers.recovery.blocks)
        loads = self.tiers.loads.fetches()
        if loads:
            self._spawn(self._fetch(loads), "kv-store-fetch")

    async def settle(self) -> None:
        """After the step: collect the batch (the next step may reuse what it copied)."""
        if self._pending is not None:
            (plan, ahead), self._pending = self._pending, None
            self._record(plan, ahead, await self.runner.finish_copies())

    def _record(self, plan: CopyPlan, ahead: CopyPlan, times: CopyTimes) -> None:
        bpb, recovery, m = self.tiers.recovery.bytes_per_block, self.tiers.recovery, self.metrics
        out_blocks = len(plan.reads) + len(plan.d2h) + len(ahead.d2h)
        for direction, blocks, seconds in (("d2h", out_blocks, times.read_s + times.d2h_s),
                                           ("h2d", plan.num_loaded, times.h2d_s)):
            if blocks:
                m.transfer(direction, blocks * bpb, seconds)
                recovery.observe(direction, blocks * bpb, seconds)
        if plan.num_loaded:
            needed = plan.num_loaded * bpb
            m.recovery_bytes(needed if times.h2d_bytes is None else times.h2d_bytes, needed)
        for block, payload in zip(plan.reads, times.payloads):
            self.writes.queue(block, payload)

    async def _fetch(self, loads: list[Load]) -> None:
        per_call = max(1, FETCH_CHUNK_BYTES // max(self.tiers.recovery.bytes_per_block, 1))
        async with self._fetch_slots:
            for i in range(0, len(loads), per_call):
                chunk = [ld for ld in loads[i:i + per_call] if not ld.done]
                if chunk:
                    await self._fetch_chunk(chunk)

    async def _fetch_chunk(self, loads: list[Load]) -> None:
        t0 = time.perf_counter()
        assert self.store is not None  # store loads are made only with a store
        expected = self.tiers.recovery.links["store_read"].time(len(loads) * self.tiers.recovery.bytes_per_block)
        try:  # slow is allowed up to 4x the measured link, then the blocks are recomputed
            values = await self.store.get_many([ld.block.hash for ld in loads], SLOW_READ_FACTOR * expected)
        except StoreUnavailable:  # counted and logged by the guard; nothing is known about the entries
            for load in loads:
                self.tiers.loads.arrived(load, None)
            self.wake()
            return
        delay = self.runner.store_delay(len(loads))  # the sim runner's entries carry no K/V: model them
        if delay:
            await asyncio.sleep(delay)
        self.observe_store("store_read", len(loads), time.perf_counter() - t0)
        got = [v for v in values if v is not None]
        if got:
            self.metrics.recovery_bytes(sum(map(len, got)), len(got) * self.tiers.recovery.bytes_per_block)
        bad, reasons = [], []
        for load, value in zip(loads, values):
            payload = None
            try:
                payload = None if value is None else decode(value, self.namespace, load.block, self.payload_bytes)
            except BadEntry as e:
                reasons.append(str(e))
            if payload is None:
                self.tiers.known.discard(load.block.hash)
                bad.append(load.block.hash)
            self.tiers.loads.arrived(load, payload)
        if bad:  # missing (evicted, pruned) or refused: routers stop crediting them
            self.metrics.store_rejected.inc(len(bad))
            self._emit_remote("removed", bad)
        if reasons:
            log.warning("%d store entries refused (%s); their blocks are recomputed", len(reasons), reasons[0])
        self.wake()

    def _written(self, hashes: list[int], seconds: float) -> None:
        self.observe_store("store_write", len(hashes), seconds)
        self._emit_remote("stored", hashes)

    def _emit_remote(self, kind: EventType, hashes: list[int]) -> None:
        self.publish(KVChange(kind, hashes, None, "remote", self.tiers.store_key))

    # -- measurements and reports ---------------------------------------------------------

    def observe_step(self, prefill_tokens: int, seconds: float) -> None:
        self.tiers.recovery.prefill.observe(prefill_tokens, seconds)
        host = self.tiers.host
        if host is not None:
            assert self.tiers.prestager is not None  # made with the host pool
            self.metrics.host_used.set(host.num_used)
            self.metrics.host_usage.set(host.num_used / host.num_slots)
            self.metrics.observe_ahead(self.tiers.prestager.outcomes)
        self.metrics.load_queue.set(len(self.tiers.loads))

    def observe_store(self, op: str, num_blocks: int, seconds: float) -> None:
        """A store call moved `num_blocks` blocks (counted as K/V bytes, like the copies) in `seconds`."""
        nbytes = num_blocks * self.tiers.recovery.bytes_per_block
        self.metrics.transfer(op, nbytes, seconds)
        self.tiers.recovery.observe(op, nbytes, seconds)

    def kv_tiers(self) -> dict:
        host = self.tiers.host
        return self.tiers.recovery.to_wire({"blocks": host.num_slots, "used": host.num_used} if host else None)

    def snapshot(self) -> dict[str, list[int]]:
        out = {}
        if self.tiers.host is not None:
            out["host"] = self.tiers.host.hashes()
        if self.store is not None:
            out["remote"] = self.tiers.known.hashes()
        return out


def build_service(tiers: TierConfig, site: TierSite, info: RunnerInfo, wiring: TierWiring,
                  registry: CollectorRegistry) -> TierService:
    """The engine's tier I/O over `wiring.tiers`, with its store (if configured) behind a guard."""
    metrics = TierMetrics(registry, site.model)
    store = None
    if tiers.kv_store:
        raw = make_store(tiers.kv_store, namespace(site, info), tiers.kv_store_id, tiers.kv_store_timeout_s)
        store = GuardedStore(raw, tiers.kv_store_timeout_s,
                             on_error=metrics.store_error,
                             on_state=lambda up: metrics.store_up.set(1 if up else 0))
    measure = None if tiers.kv_store_link else tiers.kv_store_timeout_s  # a named link is taken as given
    return TierService(wiring, store, namespace(site, info), metrics, measure)
