"""The set of engine instances: discovery, health checks, load polling, compatibility checks."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Sequence

import aiohttp

from router.config import RouterConfig
from router.index.base import BlockIndex, IndexUnavailable
from router.instance import Instance
from router.kinds import assign_kinds, discover_info, poll_load
from router.metrics import RouterMetrics
from router.protocol import hash_seed

log = logging.getLogger(__name__)


class Cluster:
    def __init__(self, config: RouterConfig, index: BlockIndex, tokenizer_fingerprint: str,
                 metrics: RouterMetrics) -> None:
        self.config = config
        self.index = index
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metrics = metrics
        self.instances = [Instance(url) for url in config.engines]
        assign_kinds(self.instances, config)
        self.session: aiohttp.ClientSession | None = None
        # model -> the block size most of its engines use; recomputed when an engine is discovered,
        # so the per-request path reads a dict instead of scanning the instances.
        self.block_sizes: dict[str, int] = {}

    # -- views ----------------------------------------------------------------------

    def by_id(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def models(self) -> list[str]:
        return sorted(self.block_sizes)

    def routable(self, model: str | None, roles: Sequence[str] | None = None) -> list[Instance]:
        return [i for i in self.instances if i.routable and (model is None or i.info.model == model)
                and (roles is None or i.info.role in roles)]

    def colocated_roles(self, model: str) -> tuple[str, ...] | None:
        """Roles that serve whole requests: "both" engines when there are any, else every engine."""
        return ("both",) if self.routable(model, ("both",)) else None

    def block_size(self, model: str) -> int:
        return self.block_sizes.get(model, 16)

    # -- discovery and compatibility ------------------------------------------------

    async def discover(self, inst: Instance) -> None:
        info = await discover_info(self, inst)
        first = inst.info is None
        if inst.info is not None and inst.info.instance_id != info.instance_id:
            log.warning("instance at %s changed id %s -> %s", inst.url, inst.info.instance_id, info.instance_id)
        inst.info = info
        self.check_compatibility()
        if first:
            inst.healthy = inst.reachable = True
            inst.needs_resync = True
            log.info("instance %s at %s: model=%s role=%s block_size=%d", info.instance_id, inst.url, info.model,
                     info.role, info.block_size)

    def check_compatibility(self) -> None:
        """Flag instances whose cache keys the router cannot reproduce (routed on load only)."""
        sizes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for inst in self.instances:
            if inst.info is not None:
                sizes[inst.info.model][inst.info.block_size] += 1
        self.block_sizes = {model: counts.most_common(1)[0][0] for model, counts in sizes.items()}
        for inst in self.instances:
            if inst.info is None:
                continue
            info, problems = inst.info, []
            if info.tokenizer != self.tokenizer_fingerprint:
                problems.append(f"tokenizer fingerprint {info.tokenizer} != router's {self.tokenizer_fingerprint}")
            if info.hash_seed != hash_seed(info.model):
                problems.append(f"hash seed {info.hash_seed} != {hash_seed(info.model)} expected for {info.model!r}")
            expected = self.block_size(info.model)
            if info.block_size != expected:
                problems.append(f"block size {info.block_size} != {expected} used by the other {info.model!r} engines")
            if problems != inst.mismatch:
                inst.mismatch = problems
                for p in problems:
                    log.error("instance %s is incompatible, routing it on load only: %s", inst.id, p)
            self.metrics.mismatch.labels(inst.id).set(1 if problems else 0)

    # -- background loops -------------------------------------------------------------

    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.probe(inst) for inst in self.instances))
            await asyncio.sleep(self.config.health_interval_s)

    async def probe(self, inst: Instance) -> None:
        try:
            if inst.info is None:
                await self.discover(inst)
                return
            await self._get_json(inst, "/health")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            self.report_failure(inst, f"health check failed: {e!r}")
        else:
            if inst.mark_success(self.config.readmit_after):
                log.warning("instance %s re-admitted; resyncing its cache index", inst.id)
                await self.discover(inst)
        finally:
            await self._clear_if_gone(inst)
            self.metrics.healthy.labels(inst.id).set(1 if inst.routable else 0)

    def report_failure(self, inst: Instance, why: str) -> None:
        was_reachable = inst.reachable
        if inst.mark_failure(self.config.eject_after):
            log.warning("instance %s ejected after %d failures (%s)", inst.id, inst.failures, why)
            self.metrics.ejections.inc()
        elif was_reachable:
            log.warning("instance %s unreachable, excluded from routing: %s", inst.id, why)

    async def _clear_if_gone(self, inst: Instance) -> None:
        if inst.down_since is None or time.monotonic() - inst.down_since < self.config.clear_grace_s:
            return
        if inst.blocks_indexed or not inst.needs_resync:
            try:
                await self.index.clear(inst.id)
            except IndexUnavailable:
                return
            log.warning("instance %s down for %.0fs: its index entries were cleared", inst.id,
                        time.monotonic() - inst.down_since)
            inst.blocks_indexed = 0
            inst.needs_resync = True

    async def load_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._poll_load(i) for i in self.instances if i.routable))
            await asyncio.sleep(self.config.load_interval_s)

    async def _poll_load(self, inst: Instance) -> None:
        try:
            inst.load = await poll_load(self, inst)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            self.report_failure(inst, f"load poll failed: {e!r}")

    async def _get_json(self, inst: Instance, path: str, **params) -> dict:
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s + params.pop("extra_s", 0.0))
        async with self.session.get(inst.url + path, params=params or None, timeout=timeout) as r:
            if r.status != 200:
                raise ValueError(f"GET {path} answered HTTP {r.status}")
            return await r.json(content_type=None)
