"""The router's fleet admin API (behind `--admin-key`; the mutating calls are off without one).

    GET    /router/engines                     the fleet: id, url, role, state, sources, health
    POST   /router/engines {"url", "role"?, "kind"?, "kv_event_source"?, "kv_event_replay_source"?}
                                               probe the URL (router/fleet/kinds: /kv/info for kvroute
                                               engines) and add it, or refuse with a 400 saying why
                                               (unreachable, not an engine, incompatible); the same
                                               URL again is a no-op (200). A `role` other than the
                                               engine's switches it; `kind` and the ZeroMQ sources
                                               are the --engine-kind / --kv-event-source fields.
    DELETE /router/engines/{id}                stop routing to it (until it is added again)
    POST   /router/engines/{id}/role {"role"}  switch its role (through the engine's /admin/role,
                                               called with the same admin key); the fleet regroups
                                               at once

SGLang router's worker API, for existing tooling:

    POST   /workers {"url", "worker_type": "regular" | "prefill" | "decode"}
    GET    /workers
    DELETE /workers/{url}                      the URL percent-encoded, or the instance id
"""

from __future__ import annotations

import logging
import urllib.parse

import aiohttp
from aiohttp import web

from kvroute.router.contract.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable
from kvroute.router.contract.http import add_body_route, json_response, read_json
from kvroute.router.contract.protocol import ROLES
from kvroute.router.fleet.instance import Instance
from kvroute.router.fleet.kinds import KIND_NAMES
from kvroute.router.fleet.upstream_errors import describe_failure
from kvroute.router.kvevents.sources import parse_sources
from kvroute.router.service.app_keys import CLUSTER, CONFIG, ZMQ

log = logging.getLogger(__name__)

WORKER_TYPES = {"regular": "both", "prefill": "prefill", "decode": "decode"}
SOURCE = "admin"


def _cluster(request: web.Request):
    config = request.app[CONFIG]
    if not config.admin_key:
        raise Forbidden("the fleet admin API needs the router started with --admin-key", code="admin_disabled")
    if request.method != "GET" and config.workers > 1:  # a change would reach one worker only
        raise Conflict(f"this router runs {config.workers} workers, and a change made here would reach only "
                       "one of them: add and remove engines through the registry (--registry), switch roles "
                       "on the engine (POST /admin/role)", code="workers_disagree")
    return request.app[CLUSTER]


def engine_row(inst: Instance) -> dict:
    info = inst.info
    return {"id": inst.id, "url": inst.url, "role": info.role if info else None, "model": info.model if info else None,
            "state": "draining" if inst.draining else "ready", "routable": inst.routable, "healthy": inst.healthy,
            "sources": sorted(inst.sources), "last_error": inst.last_error}


async def handle_list(request: web.Request) -> web.Response:
    return json_response({"engines": [engine_row(i) for i in request.app[CLUSTER].instances]})


async def handle_add(request: web.Request) -> web.Response:
    body = await read_json(request)
    url, role = body.get("url"), body.get("role")
    if role is not None and role not in ROLES:
        raise BadRequest(f"'role' must be one of {', '.join(ROLES)}, got {role!r}", param="role")
    kind, sources = foreign_fields(body)
    inst, created = await add_engine(request, url, kind, sources)
    if role is not None and inst.info is not None and inst.info.role != role:
        await switch_role(request, inst, role)
    return json_response({"engine": engine_row(inst), "created": created}, status=201 if created else 200)


def foreign_fields(body: dict) -> tuple[str, tuple | None]:
    """`kind` and the ZeroMQ event sources of an engine added through the API, validated."""
    kind, source, replay = body.get("kind", "auto"), body.get("kv_event_source"), body.get("kv_event_replay_source")
    if kind not in KIND_NAMES:
        raise BadRequest(f"'kind' must be one of {', '.join(KIND_NAMES)}, got {kind!r}", param="kind")
    if source is None:
        return kind, None
    url = "http://engine"
    try:
        return kind, parse_sources([f"{url}={source}"], [f"{url}={replay}"] if replay else [], [url])[url]
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e).replace("--kv-event-", "kv_event_"), param="kv_event_source") from None


async def add_engine(request: web.Request, url, kind: str = "auto", sources: tuple | None = None
                     ) -> tuple[Instance, bool]:
    """Probe `url` and add it to the fleet; BadRequest with the reason when it is not usable."""
    cluster = _cluster(request)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise BadRequest(f"'url' must be an http(s) URL, got {url!r}", param="url")
    existing = cluster.by_url(url)
    if existing is not None:
        existing.sources.add(SOURCE)
        return existing, False
    candidate = Instance(url, SOURCE)
    candidate.kind = kind
    try:
        await cluster.discover(candidate, dry_run=True)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise BadRequest(f"cannot add {url}: {describe_failure(e)}", param="url", code="engine_refused") from None
    problems = cluster.problems_of(candidate.info)
    if problems:
        raise BadRequest(f"cannot add {url}: incompatible: {'; '.join(problems)}", param="url",
                         code="engine_refused")
    inst, created = cluster.add(url, SOURCE)
    inst.kind = candidate.kind
    if sources:
        request.app[ZMQ].add(inst, sources)
    await cluster.probe(inst)
    return inst, created


async def handle_delete(request: web.Request) -> web.Response:
    cluster = _cluster(request)
    key = urllib.parse.unquote(request.match_info["id"])
    inst = cluster.by_id(key) or cluster.by_url(key)
    if inst is None:
        raise NotFound(f"no engine {key!r} in the fleet", code="engine_not_found")
    await cluster.remove(inst)
    return json_response({"removed": engine_row(inst)})


async def handle_role(request: web.Request) -> web.Response:
    cluster = _cluster(request)
    inst = cluster.by_id(request.match_info["id"])
    if inst is None:
        raise NotFound(f"no engine {request.match_info['id']!r} in the fleet", code="engine_not_found")
    role = (await read_json(request)).get("role")
    if role not in ROLES:
        raise BadRequest(f"'role' must be one of {', '.join(ROLES)}, got {role!r}", param="role")
    previous = inst.info.role if inst.info else None
    await switch_role(request, inst, role)
    return json_response({"engine": engine_row(inst), "previous": previous})


async def switch_role(request: web.Request, inst: Instance, role: str) -> None:
    """Ask the engine to switch (with the fleet admin key) and regroup here at once."""
    cluster = _cluster(request)
    headers = {"Authorization": f"Bearer {request.app[CONFIG].admin_key}"}
    timeout = aiohttp.ClientTimeout(total=cluster.config.connect_timeout_s)
    try:
        async with cluster.session.post(inst.url + "/admin/role", json={"role": role}, headers=headers,
                                        timeout=timeout) as r:
            if r.status != 200:
                detail = (await r.content.read(300)).decode(errors="replace")
                raise Unavailable(f"engine {inst.id} refused the role switch (HTTP {r.status}): {detail}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise Unavailable(f"engine {inst.id} unreachable for the role switch: {describe_failure(e)}") from None
    cluster.set_role(inst, role)


async def handle_workers(request: web.Request) -> web.Response:
    rows = [{"url": i.url, "id": i.id, "worker_type": _worker_type(i), "is_healthy": i.routable,
             "model_id": i.info.model if i.info else None} for i in request.app[CLUSTER].instances]
    return json_response({"workers": rows, "total": len(rows)})


def _worker_type(inst: Instance) -> str:
    role = inst.info.role if inst.info else "both"
    return {"both": "regular"}.get(role, role)


async def handle_add_worker(request: web.Request) -> web.Response:
    body = await read_json(request)
    kind = body.get("worker_type", "regular")
    if kind not in WORKER_TYPES:
        raise BadRequest(f"'worker_type' must be one of {', '.join(WORKER_TYPES)}, got {kind!r}", param="worker_type")
    inst, created = await add_engine(request, body.get("url"))
    if inst.info is not None and inst.info.role != WORKER_TYPES[kind]:
        await switch_role(request, inst, WORKER_TYPES[kind])
    return json_response({"status": "added" if created else "exists", "worker": engine_row(inst)},
                         status=201 if created else 200)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/router/engines", handle_list)
    add_body_route(app, "/router/engines", handle_add)
    app.router.add_delete("/router/engines/{id}", handle_delete)
    add_body_route(app, "/router/engines/{id}/role", handle_role)
    app.router.add_get("/workers", handle_workers)
    add_body_route(app, "/workers", handle_add_worker)
    app.router.add_delete("/workers/{id:.+}", handle_delete)
