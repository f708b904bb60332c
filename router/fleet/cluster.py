"""The set of engine instances: discovery, health checks, load polling, compatibility checks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import aiohttp

from kvroute.router.contract.limits import Limits
from kvroute.router.contract.protocol import LoadRecord
from kvroute.router.contract.tier_costs import store_owner
from kvroute.router.decision.decode_choice import colocated_roles
from kvroute.router.fleet.fleet_shape import FleetShape
from kvroute.router.fleet.groups import Group, Groups
from kvroute.router.fleet.instance import EngineInfo, Generation, Instance
from kvroute.router.fleet.kinds import assign_kinds, discover_info, poll_load
from kvroute.router.fleet.kinds.http import EngineHTTP, LeanGet
from kvroute.router.fleet.metrics import FleetMetrics
from kvroute.router.fleet.progress import ProgressWatch
from kvroute.router.fleet.settings import FleetSettings
from kvroute.router.fleet.upstream_errors import BadAnswer, describe_failure
from kvroute.router.index.base import BlockIndex, IndexUnavailable

log = logging.getLogger(__name__)

Settings = TypeVar("Settings", bound=FleetSettings)
Metrics = TypeVar("Metrics", bound=FleetMetrics)
MAX_OUT_SHARE = 0.5  # the most of a model's engines (per role) that slow answers may take out of routing


def answered_late(exc: BaseException) -> bool:
    """A timeout after the connection was made (busy or hung), not one while connecting (gone)."""
    return isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)


class Cluster(Generic[Settings, Metrics]):
    """Generic in the settings and metrics it is given: it reads its section of them (FleetSettings,
    FleetMetrics) and hands them back to whoever holds it as the types they are."""

    def __init__(self, config: Settings, index: BlockIndex, tokenizer_fingerprint: str,
                 metrics: Metrics, session: aiohttp.ClientSession | None = None,
                 on_load: Callable[[], None] = lambda: None, lean: LeanGet | None = None) -> None:
        """`config`: the router's settings, of which the fleet reads its section; `session`: the
        engines' HTTP client (None: nothing is probed or polled, as in tests that drive the cluster
        by hand; `engine_http` is also what the event feeds read /kv/events and /kv/snapshot with);
        `on_load`: called after each load report is applied; `lean`: the client of plain http://
        GETs (load polls, discovery; router/fleet/kinds/http.py)."""
        self.config = config
        self.on_load = on_load
        self.index = index
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.metrics = metrics
        self.generation = Generation()  # what router/fleet/groups.py rebuilds on
        self.instances = [Instance(url, peers=config.workers - 1, generation=self.generation)
                          for url in config.engines]  # grows, shrinks
        assign_kinds(self.instances, config)
        self.session = session
        # discovery, load polling, feeds
        self.engine_http = EngineHTTP(session=session, timeout_s=config.connect_timeout_s, lean=lean)
        self.shape = FleetShape(tokenizer_fingerprint, config.limits.max_prompt_chars, config.limits.max_body_bytes)
        self.groups = Groups(self.instances, self.generation)  # routable instances by (model, roles)
        self.progress = ProgressWatch(config.first_byte_timeout_s, metrics)  # stalled engines out, and back
        metrics.watch_inflight(self.inflight)

    def inflight(self) -> list[tuple[str, int]]:
        """(instance id, requests this router has in flight there), for the scrape."""
        return [(i.id, i.inflight) for i in self.instances]

    def idle(self) -> bool:
        """No request of this router process is in flight on any instance."""
        return not any(i.inflight for i in self.instances)

    # -- views ----------------------------------------------------------------------

    def by_id(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def by_url(self, url: str) -> Instance | None:
        url = url.rstrip("/")
        return next((i for i in self.instances if i.url == url), None)

    # -- membership (static --engine, the registry, the admin API) ---------------------

    def add(self, url: str, source: str) -> tuple[Instance, bool]:
        """The instance at `url` (created if new: (instance, True)); `source` now vouches for it."""
        inst = self.by_url(url)
        if inst is not None:
            inst.sources.add(source)
            return inst, False
        inst = Instance(url, source, peers=self.config.workers - 1, generation=self.generation)
        self.instances.append(inst)
        self.generation.bump()
        log.info("engine %s added (%s)", inst.url, source)
        return inst, True

    async def remove(self, inst: Instance, source: str | None = None, forget: bool = False) -> None:
        """`source` (None: every source) no longer vouches for `inst`; with none left it leaves
        the fleet at once (requests in flight there finish). `forget`: its index entries go too
        (its registration lapsed or it left: the fleet-wide truth, not one router's view)."""
        inst.sources = set() if source is None else inst.sources - {source}
        if inst.sources:
            return
        if inst in self.instances:
            self.instances.remove(inst)
        inst.removed = True
        self.generation.bump()
        log.warning("engine %s (%s) removed from the fleet", inst.id, inst.url)
        self.metrics.forget_instance(inst.id)
        self.check_compatibility()
        if forget:
            try:
                await self.index.clear(inst.id)
            except IndexUnavailable as e:
                log.warning("could not clear %s from the index (%s); it expires after --index-ttl-s", inst.id, e)

    def models(self) -> list[str]:
        return sorted(self.block_sizes)

    def routable(self, model: str | None, roles: Sequence[str] | None = None) -> list[Instance]:
        """Healthy instances (of `model` and `roles`, if given) that take new requests."""
        return self.groups.get(model, roles).members

    def group(self, model: str | None, roles: Sequence[str] | None = None) -> Group:
        return self.groups.get(model, roles)

    def colocated_roles(self, model: str) -> tuple[str, ...] | None:
        """Roles that serve whole requests: "both" engines when there are any, else every engine
        (router/decision/decode_choice.py, the simulator's rule too)."""
        return colocated_roles(lambda roles: bool(self.routable(model, roles)))

    def block_size(self, model: str) -> int:
        return self.shape.block_sizes.get(model, 16)

    def limits_for(self, model: str) -> Limits:
        return self.shape.limits_for(model)

    @property
    def max_body_bytes(self) -> int:
        return self.shape.max_body_bytes

    @property
    def block_sizes(self) -> dict[str, int]:
        return self.shape.block_sizes

    # -- discovery and compatibility ------------------------------------------------

    async def discover(self, inst: Instance, dry_run: bool = False) -> None:
        """Learn what the engine is (router/fleet/kinds: /kv/info for kvroute engines) into `inst.info`;
        `dry_run` (the admin API's probe of a candidate) only reads it."""
        info = await discover_info(self.engine_http, inst, self.config)
        if dry_run:
            inst.info = info
            return
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
            if inst.without_kv_events:
                log.warning("instance %s at %s is %s", info.instance_id, inst.url, inst.without_kv_events)

    def problems_of(self, info: EngineInfo) -> list[str]:
        return self.shape.problems_of(info)

    def set_role(self, inst: Instance, role: str) -> None:
        if inst.info is not None and inst.info.role != role:
            inst.info = dataclasses.replace(inst.info, role=role)
            log.warning("instance %s is now %s: regrouped", inst.id, role)

    async def _forget_old_id(self, inst: Instance, old: str, new: str) -> None:
        """An engine restarted at the same URL under another id (the default id is the pod's
        hostname): the old id's entries go now, for every router sharing the index."""
        log.warning("instance at %s changed id %s -> %s: forgetting %s", inst.url, old, new, old)
        inst.epoch, inst.seq, inst.blocks_indexed, inst.needs_resync = None, 0, 0, True
        self.metrics.forget_instance(old)
        try:
            await self.index.clear(old)
        except IndexUnavailable as e:
            log.warning("could not clear %s from the index (%s); it expires after --index-ttl-s", old, e)

    def check_compatibility(self) -> None:
        """Flag instances whose cache keys the router cannot reproduce (routed on load only)."""
        for inst, problems in self.shape.update(self.instances):
            if problems != inst.mismatch:
                inst.mismatch = problems
                for p in problems:
                    log.error("instance %s is incompatible, routing it on load only: %s", inst.id, p)
            self.metrics.mismatch.labels(inst.id).set(1 if problems else 0)

    # -- background loops -------------------------------------------------------------

    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.probe(inst) for inst in list(self.instances)))
            await asyncio.sleep(self.config.health_interval_s)

    async def probe(self, inst: Instance) -> None:
        try:
            if inst.info is None:
                await self.discover(inst)
                self._first_contact(inst)
                return
            await self._check_health(inst)
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            self.report_failure(inst, describe_failure(e), slow=answered_late(e))
        else:
            self._recovered(inst)
            if inst.mark_success(self.config.readmit_after):
                log.warning("instance %s re-admitted; resyncing its cache index", inst.id)
                await self.discover(inst)
        finally:
            self._forget_if_gone(inst)
            self.metrics.bound(self.metrics.healthy, inst.id).set(1 if inst.routable else 0)

    async def _check_health(self, inst: Instance) -> None:
        """GET /health: 200, or 503 from a draining engine (reachable, but takes no new requests)."""
        timeout = aiohttp.ClientTimeout(total=self.config.connect_timeout_s)
        assert self.session is not None, "made without a session: nothing is probed"
        async with self.session.get(inst.url + "/health", timeout=timeout) as r:
            body = await r.json(content_type=None) if r.content_type == "application/json" else {}
            draining = r.status == 503 and isinstance(body, dict) and body.get("status") == "draining"
            if r.status != 200 and not draining:
                raise BadAnswer(f"GET /health answered HTTP {r.status}")
        if draining != inst.draining:
            log.warning("instance %s %s", inst.id, "is draining: no new requests go there" if draining
                        else "takes requests again")
        inst.draining = draining

    def report_failure(self, inst: Instance, why: str, request: bool = False, exclude: bool = True,
                       slow: bool = False) -> None:
        """A failed probe, or (`request=True`) a failed request: excluded from routing at once
        (unless `exclude=False`), ejected after `eject_after` in a row. `why` is short
        (router/fleet/upstream_errors.py describe_failure). Logged when the instance starts failing or the
        reason changes, not on every retry; kept as `last_error`.

        Failed requests and probes that timed out (`slow=True`: the engine took the connection
        but did not answer in time: busy, or hung) never take more than MAX_OUT_SHARE of a
        model's engines out of routing, as Envoy caps outlier ejection: when most engines are
        slow at once the load is at fault, and taking them all out would turn slow answers into
        503s for everyone. A probe that cannot connect (a dead engine) is never capped."""
        if (request or slow) and inst.routable and not self._may_take_out(inst):
            log.debug("instance %s failed (%s) but most of its peers are out already: it stays", inst.id, why)
            return
        was_reachable, changed = inst.reachable, why != inst.last_error
        inst.last_error = why
        if inst.mark_failure(self.config.eject_after, request, self.config.ejection_s, exclude):
            count = inst.request_failures if request else inst.failures
            log.warning("instance %s ejected after %d failed %s (%s)", inst.id, count,
                        "requests" if request else "probes", why)
            self.metrics.ejections.inc()
        elif was_reachable and exclude:
            log.warning("instance %s unreachable, excluded from routing: %s", inst.id, why)
        elif changed:
            log.warning("engine %s unreachable: %s (retrying every %g s)", inst.url, why,
                        self.config.health_interval_s)

    def _recovered(self, inst: Instance) -> None:
        if inst.last_error is not None:
            log.warning("engine %s (%s) reachable again; it was: %s", inst.url, inst.id, inst.last_error)
            inst.last_error = None

    def _first_contact(self, inst: Instance) -> None:
        """Discovered for the first time: failures before it were an engine still starting, not a recovery."""
        if inst.last_error is not None:
            log.info("engine %s (%s) reached; until now: %s", inst.url, inst.id, inst.last_error)
            inst.last_error = None

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
            # a shared store's blocks live as long as an instance that uses it does (index/base.py)
            alive += sorted({store_owner(c.store) for i in self.instances if i.info is not None and i.reachable
                             and (c := i.tier_costs) is not None and c.store})
            try:
                await self.index.maintain(alive, self.config.index_ttl_s)
            except IndexUnavailable as e:
                log.debug("index maintenance skipped: %s", e)
            await asyncio.sleep(interval)

    async def load_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._poll_load(i) for i in list(self.instances)
                                   if i.info is not None and i.healthy and i.reachable))
            await asyncio.sleep(self.config.load_interval_s)

    async def _poll_load(self, inst: Instance) -> None:
        try:
            self.observe_load(inst, await poll_load(self.engine_http, inst))
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            self.report_failure(inst, describe_failure(e), slow=answered_late(e))

    def observe_load(self, inst: Instance, load: LoadRecord) -> None:
        was_draining = inst.draining
        role = inst.observe_load(load)
        self.progress.observe(inst)
        if inst.kind == "kvroute" and inst.nonstreamed:
            for dispatch in inst.nonstreamed.release(load):
                dispatch.first_byte(is_ttft=False)  # its prefill is over (router/fleet/queued_prefill.py)
        if role is not None:
            log.warning("instance %s is now %s: regrouped", inst.id, role)
        if inst.draining and not was_draining:
            log.warning("instance %s is draining: no new requests go there", inst.id)
        self.on_load()
