"""Following the fleet registry (router/contract/registry_record.py): engines join and leave while
the router runs, with no restart and no edited engine list.

At start the router loads every registered engine; then it acts on join / leave / role
announcements at once (Redis pub/sub) and re-reads the registry every `poll_s`, which
also catches what an announcement cannot say: an engine killed without a word, whose key
lapsed. A lapsed or departed engine leaves the fleet as one that stopped answering does,
and its index entries go (the registry's word is fleet-wide, unlike one router's view).
Every router replica given the same registry sees the same fleet. What it believes of the
registry is router/fleet/registry_trust.py's: a record it refuses changes nothing, so a key
overwritten with a refused record leaves the engine as its last believed record said, until that
record expires.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kvroute.router.contract.redact import redact
from kvroute.router.contract.registry_record import CHANNEL, IDS, LEFT, EngineRecord, engine_key
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.registry_trust import RegistryTrust

log = logging.getLogger(__name__)

SOURCE = "registry"


REFUSAL_LOG_EVERY_S = 10.0


class RegistryFollower:
    """With `secret`, only records signed with it are believed (router/contract/registry_record.py)."""

    def __init__(self, cluster: Cluster, url: str, poll_s: float = 1.0, secret: str | None = None,
                 on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.cluster = cluster
        self.url = url
        self.client = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.poll_s = poll_s
        self.secret, self.on_refused = secret, on_refused
        self.trust = RegistryTrust(secret)
        self.records: dict[str, EngineRecord] = {}  # instance id -> its registration
        self.refused: collections.Counter[str] = collections.Counter()  # reason -> records not believed
        self._refusal_logged = float("-inf")
        self._outage = False
        if not secret:
            log.warning("fleet registry %s is unauthenticated: any record written there is believed "
                        "(give the fleet secret, --kv-secret or KVROUTE_KV_SECRET, to routers and engines)",
                        redact(url))

    def believed(self, record: EngineRecord, kind: str | None = None) -> bool:
        """Whether this record (announced as `kind`, or None: read from its key) may change the fleet;
        a refused one is counted and logged (rate-limited)."""
        reason = self.trust.refusal(record, time.time(), kind)
        if reason is None:
            return True
        self.refused[reason] += 1
        self.on_refused(reason)
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_EVERY_S:
            self._refusal_logged = now
            log.warning("ignoring registry record for %s at %s: %s (%d refused so far)", record.instance_id,
                        record.url, reason.replace("_", " "), sum(self.refused.values()))
        return False

    async def sync_once(self) -> None:
        """The registered fleet now (at start); a registry down at start is one warning line."""
        try:
            await self.sync()
        except (RedisError, OSError) as e:
            log.warning("fleet registry %s unreachable at start (%s): following it once it is up",
                        redact(self.url), e)
            self._outage = True

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except (RedisError, OSError) as e:
                if not self._outage:
                    log.warning("fleet registry unreachable (%s): keeping the fleet as it is", e)
                self._outage = True
                await asyncio.sleep(self.poll_s)

    async def _follow(self) -> None:
        async with self.client.pubsub() as pubsub:
            await pubsub.subscribe(CHANNEL)
            await self.sync()  # after subscribing: nothing announced in between is missed
            loop = asyncio.get_running_loop()
            next_sync = loop.time() + self.poll_s
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.poll_s)
                if message is not None:
                    await self._announced(message.get("data"))
                if loop.time() >= next_sync:
                    await self.sync()
                    next_sync = loop.time() + self.poll_s

    async def sync(self) -> None:
        """Make the fleet's registry-sourced members exactly the live registrations."""
        ids = sorted(m.decode() if isinstance(m, bytes) else m for m in await self.client.smembers(IDS))
        raws = await self.client.mget([engine_key(i) for i in ids]) if ids else []
        live: dict[str, EngineRecord] = {}
        now = time.time()
        self.trust.forget_old(now)
        for instance_id, raw in zip(ids, raws):
            if raw is None:
                await self.client.srem(IDS, instance_id)  # lapsed: its key expired
                continue
            try:
                record = EngineRecord.from_json(raw)
                if record.instance_id != instance_id:
                    raise ValueError(f"its record names {record.instance_id!r}")
            except ValueError as e:
                log.warning("skipping registry entry %s: %s", instance_id, e)
                record = None
            known = self.records.get(instance_id)
            if record is not None and self.believed(record):
                if record.state != LEFT:
                    live[instance_id] = record
            elif known is not None and known.valid_at(now):  # a refused record changes nothing
                live[instance_id] = known
        if self._outage:
            log.info("fleet registry reachable again: %d engines registered", len(live))
            self._outage = False
        for record in live.values():
            await self._joined(record)
        for instance_id in [i for i in self.records if i not in live]:
            await self._left(self.records.pop(instance_id), "its registration lapsed")

    async def _announced(self, data) -> None:
        try:
            message = orjson.loads(data)
            kind, record = message["type"], EngineRecord.from_json(orjson.dumps(message["record"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            log.warning("skipping malformed registry announcement: %s", e)
            return
        if not self.believed(record, kind):
            return
        if kind == "leave" or record.state == LEFT:
            if self.records.pop(record.instance_id, None) is not None:
                await self._left(record, "it left (draining)")
        else:
            await self._joined(record)

    async def _joined(self, record: EngineRecord) -> None:
        known = self.records.get(record.instance_id)
        self.records[record.instance_id] = record
        if known is not None and known.url != record.url:
            await self._left(known, f"it moved to {record.url}")
        inst, created = self.cluster.add(record.url, SOURCE)
        if created:
            log.info("engine %s joined from the registry at %s (role %s)", record.instance_id, record.url,
                     record.role)
            await self.cluster.probe(inst)
        elif inst.info is not None and inst.info.role != record.role and inst.info.instance_id == record.instance_id:
            inst.info = dataclasses.replace(inst.info, role=record.role)
            log.warning("instance %s is now %s (registry): regrouped", inst.id, record.role)
        inst.draining = record.state == "draining"

    async def _left(self, record: EngineRecord, why: str) -> None:
        inst = self.cluster.by_url(record.url)
        if inst is None:
            return
        log.warning("engine %s leaves the fleet: %s", record.instance_id, why)
        await self.cluster.remove(inst, SOURCE, forget=True)
        if not inst.removed:  # still listed statically or through the admin API: excluded until it answers
            self.cluster.report_failure(inst, f"registry: {why}")

    async def close(self) -> None:
        await self.client.aclose()
