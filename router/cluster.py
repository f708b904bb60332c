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
from router.instance import EngineInfo, Instance
from router.limits import Limits
from router.metrics import RouterMetrics
from router.protocol import LoadRecord, hash_seed

log = logging.getLogger(__name__)

MAX_OUT_SHARE = 0.5  # the most of a model's engines (per role) that slow answers may take out of routing


def answered_late(exc: BaseException) -> bool:
    """A timeout after the connection was made (busy or hung), not one while connecting (gone)."""
    return isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)


class Cluster:
    def __init__(self, config: RouterConfig, index: BlockIndex, tokenizer_fingerprint: str,
                 metrics: RouterMetrics) -> None:
        self.config = config
        self.index = index
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metrics = metrics
        self.instances = [Instance(url) for url in config.engines]
        self.session: aiohttp.ClientSession | None = None
        # model -> the block size most of its engines use; recomputed when an engine is discovered,
        # so the per-request path reads a dict instead of scanning the instances.
        self.block_sizes: dict[str, int] = {}
        self.limits: dict[str, Limits] = {}
        self.max_body_bytes = self._limits_for(0, 0).max_body_bytes

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

    def limits_for(self, model: str) -> Limits:
        return self.limits.get(model) or self._limits_for(0, 0)

    def _limits_for(self, max_model_len: int, vocab_size: int) -> Limits:
        return Limits.derive(max_model_len, vocab_size, self.config.max_prompt_chars, self.config.max_body_bytes)

    def _update_limits(self) -> None:
        """Per model: the largest context and vocabulary its engines advertise; the body limit
        is the largest of any model's (the body is read before its model is known)."""
        lens: dict[str, int] = collections.defaultdict(int)
        vocabs: dict[str, int] = collections.defaultdict(int)
        for inst in self.instances:
            if inst.info is not None:
                lens[inst.info.model] = max(lens[inst.info.model], inst.info.max_model_len)
                vocabs[inst.info.model] = max(vocabs[inst.info.model], inst.info.vocab_size)
        self.limits = {m: self._limits_for(lens[m], vocabs[m]) for m in lens}
        self.max_body_bytes = max([lim.max_body_bytes for lim in self.limits.values()]
                                  or [self._limits_for(0, 0).max_body_bytes])

    # -- discovery and compatibility ------------------------------------------------

    async def discover(self, inst: Instance) -> None:
        data = await self._get_json(inst, "/kv/info")
        info = EngineInfo.from_dict(data)
        first = inst.info is None
        if inst.info is not None and inst.info.instance_id != info.instance_id:
            await self._forget_old_id(inst, inst.info.instance_id, info.instance_id)
        inst.info = info
        self.check_compatibility()
        if first:
            inst.healthy = inst.reachable = True
            inst.needs_resync = True
            log.info("instance %s at %s: model=%s role=%s block_size=%d", info.instance_id, inst.url, info.model,
                     info.role, info.block_size)

    async def _forget_old_id(self, inst: Instance, old: str, new: str) -> None:
        """An engine restarted at the same URL under another id (the default id is the pod's
        hostname): the old id's entries go now, for every router sharing the index."""
        log.warning("instance at %s changed id %s -> %s: forgetting %s", inst.url, old, new, old)
        inst.epoch, inst.seq, inst.blocks_indexed, inst.needs_resync = None, 0, 0, True
        for gauge in (self.metrics.healthy, self.metrics.mismatch, self.metrics.inflight):
            try:
                gauge.remove(old)
            except KeyError:
                pass
        try:
            await self.index.clear(old)
        except IndexUnavailable as e:
            log.warning("could not clear %s from the index (%s); it expires after --index-ttl-s", old, e)

    def check_compatibility(self) -> None:
        """Flag instances whose cache keys the router cannot reproduce (routed on load only)."""
        sizes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for inst in self.instances:
            if inst.info is not None:
                sizes[inst.info.model][inst.info.block_size] += 1
        self.block_sizes = {model: counts.most_common(1)[0][0] for model, counts in sizes.items()}
        self._update_limits()
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
            self.report_failure(inst, f"health check failed: {e!r}", slow=answered_late(e))
        else:
            if inst.mark_success(self.config.readmit_after):
                log.warning("instance %s re-admitted; resyncing its cache index", inst.id)
                await self.discover(inst)
        finally:
            self._forget_if_gone(inst)
            self.metrics.healthy.labels(inst.id).set(1 if inst.routable else 0)

    def report_failure(self, inst: Instance, why: str, request: bool = False, exclude: bool = True,
                       slow: bool = False) -> None:
        """A failed probe, or (`request=True`) a failed request: excluded from routing at once
        (unless `exclude=False`), ejected after `eject_after` in a row.

        Failed requests and probes that timed out (`slow=True`: the engine took the connection
        but did not answer in time: busy, or hung) never take more than MAX_OUT_SHARE of a
        model's engines out of routing, as Envoy caps outlier ejection: when most engines are
        slow at once the load is at fault, and taking them all out would turn slow answers into
        503s for everyone. A probe that cannot connect (a dead engine) is never capped."""
        if (request or slow) and inst.routable and not self._may_take_out(inst):
            log.debug("instance %s failed (%s) but most of its peers are out already: it stays", inst.id, why)
            return
        was_reachable = inst.reachable
        if inst.mark_failure(self.config.eject_after, request, self.config.ejection_s, exclude):
            count = inst.request_failures if request else inst.failures
            log.warning("instance %s ejected after %d failed %s (%s)", inst.id, count,
                        "requests" if request else "probes", why)
            self.metrics.ejections.inc()
        elif was_reachable and exclude:
            log.warning("instance %s unreachable, excluded from routing: %s", inst.id, why)

    def _may_take_out(self, inst: Instance) -> bool:
        peers = [i for i in self.instances if i.info is not None and inst.info is not None
                 and (i.info.model, i.info.role) == (inst.info.model, inst.info.role)]
        return sum(not i.routable for i in peers) + 1 <= MAX_OUT_SHARE * len(peers)

    def _forget_if_gone(self, inst: Instance) -> None:
        """This replica's own view of an instance down longer than the index TTL: it will be
        resynced when it comes back. The shared index is not cleared here: the index itself
        forgets an instance only once no router has seen it for the TTL (`maintain_loop`)."""
        if inst.down_since is None or time.monotonic() - inst.down_since < self.config.index_ttl_s:
            return
        if inst.blocks_indexed or not inst.needs_resync:
            log.warning("instance %s down for %.0fs: its index entries expire", inst.id,
                        time.monotonic() - inst.down_since)
            inst.blocks_indexed = 0
            inst.needs_resync = True

    async def maintain_loop(self) -> None:
        """Refresh the last-seen time of every instance this router reaches; the index forgets
        those that no router sharing it has seen for `index_ttl_s`."""
        interval = min(5.0, self.config.index_ttl_s / 4)
        while True:
            alive = [i.id for i in self.instances if i.info is not None and i.reachable]
            try:
                await self.index.maintain(alive, self.config.index_ttl_s)
            except IndexUnavailable as e:
                log.debug("index maintenance skipped: %s", e)
            await asyncio.sleep(interval)

    async def load_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._poll_load(i) for i in self.instances if i.routable))
            await asyncio.sleep(self.config.load_interval_s)

    async def _poll_load(self, inst: Instance) -> None:
        try:
            inst.load = LoadRecord.from_dict(await self._get_json(inst, "/load"))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            self.report_failure(inst, f"load poll failed: {e!r}", slow=answered_late(e))

    async def _get_json(self, inst: Instance, path: str, **params) -> dict:
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s + params.pop("extra_s", 0.0))
        async with self.session.get(inst.url + path, params=params or None, timeout=timeout) as r:
            if r.status != 200:
                raise ValueError(f"GET {path} answered HTTP {r.status}")
            return await r.json(content_type=None)
