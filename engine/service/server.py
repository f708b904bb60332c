"""The engine's aiohttp application: OpenAI endpoints, KV info/snapshot/events, load, metrics."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvroute.engine.config import EngineConfig
from kvroute.engine.runners.registry import RUNNERS
from kvroute.engine.service.admin import handle_drain, handle_role
from kvroute.engine.service.app_keys import (
    CONFIG,
    DRAIN,
    ENGINE,
    METRICS,
    REDIS_PUBLISHER,
    REGISTRATION,
    SERVICE,
    TOKENIZER,
    ZMQ_PUBLISHER,
)
from kvroute.engine.service.drain import Drain
from kvroute.engine.service.event_publisher import RedisEventPublisher
from kvroute.engine.service.llm_engine import LLMEngine
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.engine.service.registration import Registration
from kvroute.engine.service.serving import CompletionService
from kvroute.engine.service.zmq_publisher import ZmqEventPublisher
from kvroute.engine.transfer.transfer_api import transfer_handler
from kvroute.router.contract.connection_metrics import ConnectionCollector
from kvroute.router.contract.connections import CONNECTION_GUARD
from kvroute.router.contract.errors import BadRequest
from kvroute.router.contract.http import add_body_route, error_middleware, json_response, query_number, read_json
from kvroute.router.contract.kv_auth import secret_from
from kvroute.router.contract.openai_request import parse_request
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.redact import redact
from kvroute.router.contract.registry_record import EngineRecord
from kvroute.router.contract.serve import SHUTDOWN
from kvroute.router.contract.settings import flat
from kvroute.router.contract.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


MAX_EVENTS_TIMEOUT_S = 30.0


def model_name(app: web.Application) -> str:
    return app[CONFIG].model_name(app[ENGINE].runner.info)


async def _engine_ctx(app: web.Application):
    config = app[CONFIG]
    runner = RUNNERS[config.runner.backend](config.runner, config.batch, config.tiers)
    tokenizer = load_tokenizer(config.runner.model)
    name = config.model_name(runner.info)
    metrics = EngineMetrics(name, max_model_len=runner.info.max_model_len)
    metrics.registry.register(ConnectionCollector(lambda: app.get(CONNECTION_GUARD), prefix="kvroute_engine"))
    stop_ids = frozenset(tokenizer.stop_token_ids) | (
        {runner.info.eos_token_id} if runner.info.eos_token_id is not None else set())
    engine = LLMEngine(config, runner, frozenset(stop_ids), metrics)
    app[TOKENIZER], app[METRICS], app[ENGINE] = tokenizer, metrics, engine
    app[SERVICE] = CompletionService(engine, tokenizer, name, tuple(a for a, _ in config.runner.adapter_dirs))
    await engine.start(kv_info(app))
    app[DRAIN] = Drain(engine, config.server.drain_timeout_s, app[SHUTDOWN], deregister=lambda: _leave_registry(app),
                       flush=lambda: _flush_events(app))
    log.info("engine %s ready: backend=%s model=%s blocks=%d x %d", config.server.instance, config.runner.backend,
             name, config.batch.num_blocks, config.batch.block_size)
    yield
    await engine.stop()
    app[SERVICE].pool.close()


async def _zmq_ctx(app: web.Application):
    config = app[CONFIG]
    engine = app[ENGINE]
    assert config.zmq.kv_events_zmq is not None  # this context is added only with it (create_app)
    publisher = ZmqEventPublisher(events=engine.events, blocks=engine.block_manager, model=model_name(app),
                                  endpoint=config.zmq.kv_events_zmq, replay_endpoint=config.zmq.kv_events_replay,
                                  encoding=config.zmq.kv_events_encoding, topic=config.zmq.kv_events_topic,
                                  buffer_steps=config.zmq.kv_events_buffer_steps)
    app[ZMQ_PUBLISHER] = publisher
    await publisher.start()
    yield
    await publisher.stop()


async def _redis_ctx(app: web.Application):
    engine = app[ENGINE]
    redis = app[CONFIG].server.redis
    assert redis is not None  # this context is added only with it (create_app)
    publisher = RedisEventPublisher(redis, events=engine.events, load=engine.load)
    await publisher.start()
    app[REDIS_PUBLISHER] = publisher
    yield
    await publisher.stop()


async def _registry_ctx(app: web.Application):
    config = app[CONFIG]
    server = config.server
    assert server.registry is not None  # this context is added only with it (create_app)
    registration = Registration(server.registry, lambda: registry_record(app), server.registry_refresh_s,
                                server.registry_ttl_s, secret_from(server.kv_secret))
    await registration.start()
    app[REGISTRATION] = registration
    log.info("registered as %s at %s in %s", server.instance, registry_record(app).url, redact(server.registry))
    yield
    await registration.stop()


async def _leave_registry(app: web.Application) -> None:
    registration = app.get(REGISTRATION)
    if registration is not None:
        await registration.leave()


async def _flush_events(app: web.Application) -> None:
    publisher = app.get(REDIS_PUBLISHER)
    if publisher is not None:
        await publisher.flush()


def registry_record(app: web.Application) -> EngineRecord:
    """The engine's registry record now, unsigned (engine/service/registration.py signs it)."""
    config, engine = app[CONFIG], app[ENGINE]
    server = config.server
    return EngineRecord(instance_id=server.instance, url=server.advertise, role=engine.role, model=model_name(app),
                        cluster_id=server.cluster, epoch=engine.events.epoch,
                        state="draining" if engine.draining else "ready")


def kv_info(app: web.Application) -> dict:
    config, engine, tok = app[CONFIG], app[ENGINE], app[TOKENIZER]
    info = engine.runner.info
    return {
        "instance_id": config.server.instance,
        "cluster_id": config.server.cluster,
        "model": model_name(app),
        "block_size": config.batch.block_size,
        "hash_seed": hash_seed(model_name(app)),
        "hash_algo": "xxh3_64-chained-u32le",
        "tokenizer": tok.fingerprint,
        "role": engine.role,
        "state": "draining" if engine.draining else "ready",
        "backend": config.runner.backend,
        "num_blocks": config.batch.num_blocks,
        "max_model_len": info.max_model_len,
        "vocab_size": info.vocab_size,
        "dtype": info.dtype,
        "num_layers": info.num_layers,
        "num_kv_heads": info.num_kv_heads,
        "head_dim": info.head_dim,
        "epoch": engine.events.epoch,
        "adapters": list(app[SERVICE].adapters),  # LoRA adapters a request's model may name (keyed by the seed)
        "max_loras": config.runner.adapter_slots,
        **_zmq_info(app),
        **({"kv_tiers": engine.kv.kv_tiers()} if engine.kv is not None else {}),
    }


def _zmq_info(app: web.Application) -> dict:
    publisher = app.get(ZMQ_PUBLISHER)
    if publisher is None:
        return {}
    return {"kv_events_zmq": publisher.endpoint, "kv_events_replay": publisher.replay_endpoint,
            "kv_events_encoding": app[CONFIG].zmq.kv_events_encoding}


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await request.app[SERVICE].handle(request, "completion")


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[SERVICE].handle(request, "chat")


def model_card(app: web.Application, adapter: str | None = None) -> dict:
    """The base model's card, or an adapter's as vLLM lists `--lora-modules`: `parent` the base model."""
    config, base = app[CONFIG], model_name(app)
    card = {"id": adapter or base, "object": "model", "created": int(time.time()), "owned_by": "kvroute",
            "root": (dict(config.runner.adapter_dirs)[adapter] or adapter) if adapter else config.runner.model or base,
            "parent": base if adapter else None, "max_model_len": app[ENGINE].runner.info.max_model_len}
    return card


async def handle_models(request: web.Request) -> web.Response:
    app = request.app
    return json_response({"object": "list",
                          "data": [model_card(app), *(model_card(app, a) for a in app[SERVICE].adapters)]})


async def handle_model(request: web.Request) -> web.Response:
    return json_response(model_card(request.app, request.app[SERVICE].check_model(request.match_info["model"])))


async def handle_health(request: web.Request) -> web.Response:
    """503 while draining or while the step loop is stuck (a hung model step): routers stop sending."""
    config, engine = request.app[CONFIG], request.app[ENGINE]
    if engine.draining:
        return json_response({"status": "draining", "instance_id": config.server.instance,
                              "running": len(engine.requests)}, status=503)
    stalled = engine.stalled_for()
    if stalled > config.server.stall_timeout_s:
        return json_response({"status": "stalled", "instance_id": config.server.instance,
                              "stalled_s": round(stalled, 1)}, status=503)
    return json_response({"status": "ok", "instance_id": config.server.instance})


async def handle_metrics(request: web.Request) -> web.Response:
    request.app[METRICS].observe_state(request.app[ENGINE].core)
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_load(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE].load().to_dict())


async def handle_kv_info(request: web.Request) -> web.Response:
    return json_response(kv_info(request.app))


async def handle_kv_snapshot(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return json_response({
        "instance": engine.config.server.instance,
        "epoch": engine.events.epoch,
        "seq": engine.events.seq,
        "tiers": {"device": engine.block_manager.cached_hashes(), **(engine.kv.snapshot() if engine.kv else {})},
        "store": (engine.kv.tiers.store_key or None) if engine.kv is not None else None,  # the same tiers
        "load": engine.load().to_dict(),
    })


async def handle_kv_events(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    since = query_number(request, "since", 0, int)
    timeout = min(query_number(request, "timeout", 0.0, float), MAX_EVENTS_TIMEOUT_S)
    epoch = query_number(request, "epoch", None, int)
    batch = await engine.events.wait(since, timeout, epoch)
    return json_response({
        "instance": engine.config.server.instance,
        "epoch": batch.epoch,
        "seq": batch.seq,
        "resync": batch.resync,
        "events": [e.to_dict() for e in batch.events],
        "load": engine.load().to_dict(),
    })


async def handle_tokenize(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body = await read_json(request, service.limits.max_body_bytes)
    service.check_model(body.get("model"))
    if "messages" in body:
        req = parse_request(body, "chat")
    elif isinstance(body.get("prompt"), str):
        req = parse_request(body, "completion")
    else:
        raise BadRequest("'prompt' (a string) or 'messages' is required", param="prompt")
    tokens = await service.prompt_ids(req)
    return json_response({"count": len(tokens), "max_model_len": service.max_model_len, "tokens": tokens})


async def handle_get_model_info(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    return json_response({"model_path": config.runner.model or model_name(request.app),
                          "tokenizer_path": config.runner.model or "builtin", "is_generation": True})


async def handle_get_server_info(request: web.Request) -> web.Response:
    info = {k: v for k, v in flat(request.app[CONFIG]).items()
            if k not in ("redis", "registry", "kv_secret", "admin_key", "kv_store")}  # may carry credentials
    info.update(kv_info(request.app), version="kvroute-0.1.0")
    return json_response(info)


async def handle_get_load(request: web.Request) -> web.Response:
    load = request.app[ENGINE].load()
    return json_response({"load": load.running + load.waiting, "num_reqs": load.running,
                          "num_waiting_reqs": load.waiting, "num_tokens": load.queued_prefill_tokens})


def create_app(config: EngineConfig) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=1 << 40)  # bodies go through read_body
    app[CONFIG] = config
    app[SHUTDOWN] = asyncio.Event()  # set when a drain is done: the server stops (router/contract/serve.py)
    app.cleanup_ctx.append(_engine_ctx)
    if config.server.redis:
        app.cleanup_ctx.append(_redis_ctx)
    if config.server.registry:
        app.cleanup_ctx.append(_registry_ctx)
    if config.zmq.kv_events_zmq:
        app.cleanup_ctx.append(_zmq_ctx)
    add_body_route(app, "/v1/completions", handle_completions)
    add_body_route(app, "/v1/chat/completions", handle_chat)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/v1/models/{model:.+}", handle_model)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/load", handle_load)
    app.router.add_get("/kv/info", handle_kv_info)
    app.router.add_get("/kv/snapshot", handle_kv_snapshot)
    app.router.add_get("/kv/events", handle_kv_events)
    add_body_route(app, "/kv/transfer", transfer_handler(lambda a: a[ENGINE]))
    add_body_route(app, "/tokenize", handle_tokenize)
    app.router.add_get("/get_model_info", handle_get_model_info)
    app.router.add_get("/get_server_info", handle_get_server_info)
    app.router.add_get("/get_load", handle_get_load)
    add_body_route(app, "/admin/drain", handle_drain)
    add_body_route(app, "/admin/role", handle_role)
    return app
