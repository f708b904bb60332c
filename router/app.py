"""The router's aiohttp application: OpenAI proxy, /router/* introspection, health, metrics."""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router.cluster import Cluster
from router.config import RouterConfig
from router.disagg import Disaggregation
from router.errors import Unauthorized
from router.events import EventSync, PollFollower, RedisFollower
from router.http import error_middleware, json_response, read_json
from router.index import make_index
from router.index.instrumented import InstrumentedIndex
from router.kvevents.follower import ZmqFollower
from router.metrics import RouterMetrics
from router.policies import make_policy
from router.proxy import Proxy
from router.routing import Router
from router.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", RouterConfig)
CLUSTER = web.AppKey("cluster", Cluster)
ROUTER = web.AppKey("router", Router)
PROXY = web.AppKey("proxy", Proxy)
METRICS = web.AppKey("metrics", RouterMetrics)

OPENAI_PATHS = ("/v1/",)
ADMIN_PATHS = ("/router/",)


def _authorized(request: web.Request, key: str | None) -> bool:
    if not key:
        return True
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())


@web.middleware
async def auth_middleware(request: web.Request, handler):
    config = request.app[CONFIG]
    if request.path.startswith(OPENAI_PATHS) and not _authorized(request, config.api_key):
        raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
    if request.path.startswith(ADMIN_PATHS) and not _authorized(request, config.admin_key):
        raise Unauthorized("missing or invalid admin key (Authorization: Bearer <key>)")
    return await handler(request)


async def _router_ctx(app: web.Application):
    config = app[CONFIG]
    metrics = RouterMetrics()
    tokenizer = load_tokenizer(config.tokenizer)
    index = InstrumentedIndex(make_index(config.index, url=config.redis), metrics.registry)
    rng = random.Random(config.seed)
    policy = make_policy(config.policy, rng=rng)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
    cluster = Cluster(config, index, tokenizer.fingerprint, metrics)
    cluster.session = session
    router = Router(cluster, policy, tokenizer, metrics, config.policy)
    app[METRICS], app[CLUSTER], app[ROUTER] = metrics, cluster, router
    app[PROXY] = proxy = Proxy(router, cluster, session)
    proxy.disagg = Disaggregation(proxy, config.pd_min_uncached, rng)
    zmq_sources = config.foreign_engines()[1]
    zmq_follower = ZmqFollower(cluster.instances, index, zmq_sources, config.kv_event_topic,
                               config.kv_event_replay_timeout_s, metrics.registry) if zmq_sources else None
    await asyncio.gather(*(cluster.probe(inst) for inst in cluster.instances))
    sync = EventSync(cluster)
    follower = RedisFollower(sync, config.redis) if config.events == "redis" else PollFollower(sync)
    tasks = [asyncio.create_task(coro, name=name) for name, coro in (
        ("health", cluster.health_loop()), ("load", cluster.load_loop()), ("events", follower.run()),
        ("index-size", _index_size_loop(cluster, metrics)))]
    if zmq_follower is not None:
        tasks.append(asyncio.create_task(zmq_follower.run(), name="kv-events-zmq"))
    log.info("router ready: policy=%s index=%s events=%s engines=%d (%d routable)", config.policy, config.index,
             config.events, len(cluster.instances), sum(i.routable for i in cluster.instances))
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if isinstance(follower, RedisFollower):
        await follower.close()
    if zmq_follower is not None:
        zmq_follower.close()
    await index.close()
    await session.close()


async def _index_size_loop(cluster: Cluster, metrics: RouterMetrics) -> None:
    while True:
        try:
            metrics.index_size.set(await cluster.index.size())
        except Exception as e:  # the index may be unreachable; the gauge just goes stale
            log.debug("index size unavailable: %s", e)
        await asyncio.sleep(5.0)


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request, "completion")


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request, "chat")


async def handle_models(request: web.Request) -> web.Response:
    now = int(time.time())
    data = [{"id": m, "object": "model", "created": now, "owned_by": "kvroute"}
            for m in request.app[CLUSTER].models()]
    return json_response({"object": "list", "data": data})


async def handle_health(request: web.Request) -> web.Response:
    routable = sum(i.routable for i in request.app[CLUSTER].instances)
    status = 200 if routable else 503
    return json_response({"status": "ok" if routable else "no routable instance", "routable": routable},
                         status=status)


async def handle_metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[METRICS].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_instances(request: web.Request) -> web.Response:
    return json_response({"instances": [i.to_dict() for i in request.app[CLUSTER].instances]})


async def handle_explain(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    body = await read_json(request)
    kind = "chat" if "messages" in body else "completion"
    prepared = await router.prepare(body, kind)
    disagg = request.app[PROXY].disagg
    if disagg.active(prepared.model):
        return json_response(await disagg.explain(prepared))
    choice = await router.decide(prepared, record=False, roles=request.app[CLUSTER].colocated_roles(prepared.model))
    return json_response(router.explain(prepared, choice))


def create_app(config: RouterConfig) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware], client_max_size=64 * 1024 * 1024)
    app[CONFIG] = config
    app.cleanup_ctx.append(_router_ctx)
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/chat/completions", handle_chat)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/router/instances", handle_instances)
    app.router.add_post("/router/explain", handle_explain)
    return app
