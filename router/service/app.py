"""The router's aiohttp application: OpenAI proxy, /router/* introspection, health, metrics."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvroute.router.contract.connection_metrics import ConnectionCollector
from kvroute.router.contract.connections import CONNECTION_GUARD, CONNECTION_LIMITS
from kvroute.router.contract.errors import Unauthorized
from kvroute.router.contract.http import (
    add_body_route,
    json_response,
    make_error_middleware,
    parse_json,
    query_number,
    read_body,
)
from kvroute.router.contract.kv_auth import secret_from
from kvroute.router.contract.tokenize_pool import TokenizePool
from kvroute.router.contract.tokenizer import load_tokenizer
from kvroute.router.decision.fleet_share import FleetShare
from kvroute.router.decision.policies import make_policy
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.registry import RegistryFollower
from kvroute.router.index import BreakerIndex, MemoryIndex, make_index
from kvroute.router.index.instrumented import InstrumentedIndex
from kvroute.router.index.split import SplitIndex
from kvroute.router.kvevents.engine_feed import EventSync, PollFollower, RedisFollower
from kvroute.router.kvevents.follower import ZmqFollower
from kvroute.router.service import admin, route_api, tenant_admin
from kvroute.router.service.admission_gate import AdmissionGate
from kvroute.router.service.admission_metrics import AdmissionMetrics
from kvroute.router.service.admission_store import RedisLedger
from kvroute.router.service.app_keys import (
    CLUSTER,
    CONFIG,
    DISAGG,
    ENTRY,
    EXT_PROC_PORT,
    GATE,
    METRICS,
    PATH,
    PICKER,
    PROXY,
    ROUTER,
    SHARED,
    TENANTS,
    ZMQ,
)
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.disagg import Disaggregation
from kvroute.router.service.endpoints import Endpoints
from kvroute.router.service.entry import ROUTED, Entry
from kvroute.router.service.fleet_admission import SharedAdmission, replica_id
from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.model_cards import MODELS_PATH, models_list, one_model
from kvroute.router.service.picker import Picker
from kvroute.router.service.proxy import Proxy
from kvroute.router.service.request_path import RequestPath
from kvroute.router.service.routing import Router
from kvroute.router.service.routing_loss import RoutingLoss
from kvroute.router.service.silent_miss_alarms import SilentMissAlarms
from kvroute.router.service.tenant_book import TENANT_KEY, TenantBook
from kvroute.router.service.upstream import Upstream

log = logging.getLogger(__name__)

__all__ = ["CLUSTER", "CONFIG", "DISAGG", "ENTRY", "METRICS", "PROXY", "ROUTER", "ZMQ", "create_app"]

OPENAI_PATHS = ("/v1/",)
# Introspection and fleet admin: the fleet's URLs, loads and what is cached where. Behind the admin key
# when there is one, else behind the API key; open only on a router with neither. /health and /metrics
# stay open (probes and scrapers); docs/router.md says so.
ADMIN_PATHS = ("/router/", "/workers", "/admin/")
EXPLAIN_PATH = "/router/explain"  # also for API-key holders: it shows what sending the request would


def _authorized(request: web.Request, *keys: str | None) -> bool:
    given = request.headers.get("Authorization", "").encode()
    return any(hmac.compare_digest(given, f"Bearer {key}".encode()) for key in keys if key)


@web.middleware
async def auth_middleware(request: web.Request, handler):
    config, path, book = request.app[CONFIG], request.path, request.app[TENANTS]
    if path.startswith(OPENAI_PATHS):
        if book.has_keys:
            tenant = book.tenant_of_key(request.headers.get("Authorization", ""))
            if tenant is None:
                raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
            request[TENANT_KEY] = tenant  # the request's tenant (router/service/tenant_book.py)
    elif path.startswith(ADMIN_PATHS) and (config.admin_key or book.has_keys):
        ok = bool(config.admin_key) and _authorized(request, config.admin_key)
        if not ok and (not config.admin_key or path == EXPLAIN_PATH):
            tenant = book.tenant_of_key(request.headers.get("Authorization", ""))
            ok = tenant is not None
            if tenant is not None and path == EXPLAIN_PATH:
                request[TENANT_KEY] = tenant  # explained as the key's tenant, as its request would be
        if not ok:
            which = "admin key" if config.admin_key else "API key"
            raise Unauthorized(f"missing or invalid {which} (Authorization: Bearer <key>): "
                               f"{path} shows the fleet and its caches")
    return await handler(request)


async def _router_ctx(app: web.Application):
    config = app[CONFIG]
    metrics = app[METRICS]
    tokenizer = load_tokenizer(config.tokenizer)
    backend = make_index(config.index, url=config.redis, timeout=config.index_timeout_s)
    breaker = BreakerIndex(backend, config.index_breaker_failures, config.index_breaker_cooldown_s, metrics.registry)
    zmq_index = MemoryIndex()  # ZeroMQ-fed instances: this replica's own (router/index/split.py)
    index = InstrumentedIndex(SplitIndex(breaker, zmq_index), metrics.registry)
    rng = random.Random(config.seed)
    policy = make_policy(config.policy, rng=rng)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
    share = (FleetShare(replica_id(), config.admission, config.admission_sync_s, replicas=config.workers)
             if config.shared_admission else None)
    app[GATE] = gate = AdmissionGate(config.admission, app[TENANTS], AdmissionMetrics(metrics.registry),
                                     workers=config.workers, share=share)
    lean = Upstream()  # the load polls' keep-alive client (router/fleet/kinds/http.py)
    cluster = Cluster(config, index, tokenizer.fingerprint, metrics, session=session, on_load=gate.poke, lean=lean)
    shared = None
    if share is not None:
        assert config.redis is not None  # shared_admission is --redis with --admission-sync-s > 0
        shared = SharedAdmission(share, RedisLedger(config.redis, timeout_s=config.index_timeout_s),
                                 lambda: cluster.instances, gate.queue.head_tags, gate.poke, metrics.registry)
    app[SHARED] = shared
    pool = TokenizePool(config.limits.tokenize_workers, config.limits.tokenize_queue,
                        idle_inline_chars=config.tokenize_idle_inline_chars)
    alarms = SilentMissAlarms(lambda: cluster.instances, lambda: cluster.generation.value, metrics.registry)
    router = Router(cluster, policy, tokenizer, metrics, config.policy, pool, on_progress=gate.poke,
                    loss=RoutingLoss(metrics.registry, on_sample=alarms.observe))
    app[CLUSTER], app[ROUTER] = cluster, router
    app[PATH] = path = RequestPath(router, cluster, gate)
    app[PROXY] = proxy = Proxy(path, session)
    app[DISAGG] = disagg = Disaggregation(proxy, config.pd_min_uncached, rng, secret_from(config.kv_secret))
    app[ENTRY] = Entry(path, cluster, proxy, disagg)
    app[PICKER] = Picker(path, cluster, Endpoints())
    on_sighup = tenant_admin.reload_on_signal(app[TENANTS])
    zmq_sources = config.foreign_engines()[1]
    app[ZMQ] = zmq_follower = ZmqFollower(cluster.instances, zmq_index, zmq_sources, config.kv_event_topic,
                                          config.kv_event_replay_timeout_s, metrics.registry,
                                          max_engine_blocks=config.kv_event_max_blocks)
    await asyncio.gather(*(cluster.probe(inst) for inst in cluster.instances))
    sync = EventSync(cluster)
    # --events redis without --redis is refused by RouterConfig
    follower = RedisFollower(sync, config.redis or "") if config.events == "redis" else PollFollower(sync)
    registry = (RegistryFollower(cluster, config.registry, secret=secret_from(config.kv_secret),
                                 on_refused=lambda reason: metrics.registry_refused.labels(reason).inc())
                if config.registry else None)
    loops = [("health", cluster.health_loop()), ("load", cluster.load_loop()), ("events", follower.run()),
             ("index-maintenance", cluster.maintain_loop())]
    if registry is not None:
        await registry.sync_once()  # the fleet as registered now, before the first request
        loops.append(("registry", registry.run()))
    loops += [("index-size", _index_size_loop(cluster, metrics)), ("kv-events-zmq", zmq_follower.run())]
    if shared is not None:
        await shared.sync_once()  # the fleet's admission state before the first request, if Redis answers
        loops.append(("admission-sync", shared.run()))
    tasks = [asyncio.create_task(coro, name=name) for name, coro in loops]
    log.info("router ready: policy=%s index=%s events=%s engines=%d (%d routable)", config.policy, config.index,
             config.events, len(cluster.instances), sum(i.routable for i in cluster.instances))
    yield
    on_sighup()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if isinstance(follower, RedisFollower):
        await follower.close()
    if registry is not None:
        await registry.close()
    zmq_follower.close()
    if shared is not None:
        await shared.close()
    await index.close()
    await session.close()
    proxy.upstream.close()
    lean.close()
    pool.close()


async def _ext_proc_ctx(app: web.Application):
    """The endpoint picker's gRPC server (--ext-proc-port), over the same picker as POST /v1/route."""
    from kvroute.router.service.ext_proc.exchange import Exchange  # the protos: only with the flag
    from kvroute.router.service.ext_proc.servers import make_server

    config, cluster, picker, book = app[CONFIG], app[CLUSTER], app[PICKER], app[TENANTS]
    assert config.ext_proc_port is not None  # this context runs only with the flag
    server = make_server(config.ext_proc_server, lambda: Exchange(picker, book, cluster.max_body_bytes),
                         lambda: any(inst.routable for inst in cluster.instances), config.host, config.ext_proc_port)
    await server.start()
    app[EXT_PROC_PORT] = server.port
    yield
    await server.stop()


async def _index_size_loop(cluster: Cluster, metrics: RouterMetrics) -> None:
    while True:
        try:
            metrics.index_size.set(await cluster.index.size())
        except Exception as e:  # the index may be unreachable; the gauge just goes stale
            log.debug("index size unavailable: %s", e)
        await asyncio.sleep(5.0)


def _entry(kind: str):
    """The handler of a path whose requests go to an engine (router/service/entry.py `ROUTED`)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await request.app[ENTRY].handle(request, kind)

    return handle


async def handle_models(request: web.Request) -> web.Response:
    return json_response(models_list(request.app[CLUSTER]))


async def handle_model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the model's card, or 404 model_not_found naming the served models."""
    return json_response(one_model(request.app[ROUTER], request.match_info["model"]))


async def handle_health(request: web.Request) -> web.Response:
    instances = request.app[CLUSTER].instances
    routable = sum(i.routable for i in instances)
    status = 200 if routable else 503
    stale = sorted(i.id for i in instances if i.feed_stale is not None)  # routed on load alone until resynced
    out: dict[str, object] = {"status": "ok" if routable else "no routable instance", "routable": routable,
                              "stale_feeds": stale}
    shared = request.app.get(SHARED)
    if shared is not None:  # local while Redis is lost: still serving, so still 200
        out["admission"] = shared.health()
    return json_response(out, status=status)


async def handle_metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[METRICS].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_instances(request: web.Request) -> web.Response:
    return json_response({"instances": [i.to_dict() for i in request.app[CLUSTER].instances]})


async def handle_stats(request: web.Request) -> web.Response:
    """Recent requests: rates, TTFT/TPOT percentiles and SLO attainment (?window=S&slo_ttft=S&slo_tpot=S)."""
    def number(name: str, default: float | None) -> float | None:
        return query_number(request, name, default, positive=True)

    window = number("window", 60.0)
    assert window is not None  # it has a default
    stats = request.app[ROUTER].recent.stats(window, number("slo_ttft", None), number("slo_tpot", None))
    stats["engines"] = [i.to_dict() for i in request.app[CLUSTER].instances]
    stats["routing_loss"] = request.app[ROUTER].loss.stats(window)  # router/service/routing_loss.py
    stats["workers"] = request.app[CONFIG].workers  # this answer covers one worker's share of the traffic
    stats["worker_pid"] = os.getpid()
    return json_response(stats)


async def handle_explain(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    body = parse_json(await read_body(request, request.app[CLUSTER].max_body_bytes))
    kind = "chat" if "messages" in body else "completion"
    prepared = await router.prepare(body, kind)
    disagg = request.app[DISAGG]
    if disagg.active(prepared.model):
        return json_response(await disagg.explain(prepared))
    roles = request.app[CLUSTER].colocated_roles(prepared.model)
    choice = await router.decide(prepared, record=False, roles=roles)
    out = router.explain(prepared, choice)
    ticket = request.app[PATH].ticket(body, request.headers, request.get(TENANT_KEY))
    out["admission"] = request.app[GATE].explain(ticket, await router.predict(prepared, roles))
    return json_response(out)




def create_app(config: RouterConfig) -> web.Application:
    # Request bodies are read through read_body, bounded by the limit derived from the engines'
    # context (router/contract/limits.py), which is only known once they are discovered.
    metrics = RouterMetrics()
    app = web.Application(middlewares=[make_error_middleware(metrics.observe_rejected), auth_middleware],
                          client_max_size=1 << 40)
    app[CONFIG], app[METRICS] = config, metrics
    app[TENANTS] = TenantBook(config.tenants, config.tenant_keys(), config.tenant_header, config.trust_tenant_header)
    app[CONNECTION_LIMITS] = config.connections
    metrics.registry.register(ConnectionCollector(lambda: app.get(CONNECTION_GUARD)))
    app.cleanup_ctx.append(_router_ctx)
    if config.ext_proc_port is not None:
        app.cleanup_ctx.append(_ext_proc_ctx)
    for path, kind in ROUTED.items():
        add_body_route(app, path, _entry(kind))
    app.router.add_get(MODELS_PATH, handle_models)
    app.router.add_get(MODELS_PATH + "/{model:.+}", handle_model)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/router/instances", handle_instances)
    add_body_route(app, "/router/explain", handle_explain)
    app.router.add_get("/router/stats", handle_stats)
    admin.add_routes(app)
    tenant_admin.add_routes(app)
    route_api.add_routes(app)
    return app
