"""The route-only API: kvroute decides, another data plane sends and relays (docs/router.md#route-only-api).

    POST /v1/route                     a completion or chat body -> the chosen instance (id, URL,
                                       `ip:port`), the fallbacks in order, the predicted TTFT and
                                       cached tokens, the admission verdict, a route id; the choice is
                                       charged as sent (in flight, queued prefill, the tenant's slot)
    POST /v1/route/{id}/first_token    the answer's first byte reached the client
    POST /v1/route/{id}/finish         it ended: {"status": 200, "usage": {...}, "served_by": "ip:port"}
                                       (all optional; `served_by`: a fallback served it, the charge moves)

A refusal is the proxy's: 429 or 503 with Retry-After and the OpenAI error body. A route not
finished within --request-timeout-s is finished by the router (status `timeout`), so a data plane
that forgets cannot hold an engine's charge for ever. The header
`x-gateway-destination-endpoint-subset` (endpoints, comma-separated) limits the choice as Envoy's
subset hint does. Same stages, same decision as the proxy and the endpoint picker
(router/service/picker.py).
"""

from __future__ import annotations

from aiohttp import web

from kvroute.router.contract.errors import BadRequest, Overloaded
from kvroute.router.contract.http import CONTROL_BODY_LIMIT, add_body_route, json_response, parse_json, read_body
from kvroute.router.service.app_keys import CLUSTER, CONFIG, PICKER, ROUTES
from kvroute.router.service.endpoints import split_endpoints
from kvroute.router.service.open_routes import OpenRoutes
from kvroute.router.service.steering import forwardable
from kvroute.router.service.tenant_book import TENANT_KEY
from kvroute.router.service.usage import Usage

SUBSET_HEADER = "x-gateway-destination-endpoint-subset"
MAX_OPEN = 1 << 16  # routes open at once: past it a new one is refused, 503 with Retry-After, before its body is read


def _instance(picker, inst) -> dict:
    return {"instance": inst.id, "url": inst.url, "endpoint": picker.endpoint(inst)}


async def handle_route(request: web.Request) -> web.Response:
    app = request.app
    routes, picker = app[ROUTES], app[PICKER]
    if len(routes) >= MAX_OPEN:  # the router's capacity, not this request's fault: a 503 the client may retry
        raise Overloaded(f"{MAX_OPEN} routes are open: retry, or finish them (POST /v1/route/{{id}}/finish)",
                         retry_after=1.0, code="routes_open")
    raw = await read_body(request, app[CLUSTER].max_body_bytes)
    body, _ = forwardable(parse_json(raw), raw)
    subset = request.headers.get(SUBSET_HEADER)
    kind = "chat" if "messages" in body else "completion"
    picked = await picker.pick(body, kind, request.headers, request.get(TENANT_KEY),
                               split_endpoints(subset) if subset is not None else None)
    route_id = routes.add(picked)
    ticket = picked.flight.ticket
    return json_response({
        "route_id": route_id, **_instance(picker, picked.instance),
        "fallbacks": [_instance(picker, inst) for inst in picked.fallbacks],
        "predicted_ttft_s": picked.predicted_ttft_s,
        "predicted_cached_tokens": picked.choice.cached_tokens,
        "admission": {"action": "admit", "tenant": ticket.spec.name, "band": ticket.band, "queued": ticket.queued},
        "expires_in_s": routes.timeout_s})


async def handle_first_token(request: web.Request) -> web.Response:
    picked = request.app[ROUTES].get(request.match_info["route_id"])
    picked.first_token(is_ttft=picked.flight.prepared.request.stream)
    return json_response({"route_id": request.match_info["route_id"], "instance": picked.instance.id})


async def handle_finish(request: web.Request) -> web.Response:
    raw = await read_body(request, CONTROL_BODY_LIMIT)
    report = parse_json(raw) if raw else {}
    status, served = report.get("status", 200), report.get("served_by")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise BadRequest(f"'status' must be an HTTP status, got {str(status)[:40]}", param="status")
    if served is not None and not isinstance(served, str):
        raise BadRequest("'served_by' must be an endpoint, ip:port", param="served_by")
    picker = request.app[PICKER]
    picked = request.app[ROUTES].pop(request.match_info["route_id"])
    try:  # popped: no timer finishes it now, so this does whatever fails (its charges released)
        if served:
            picker.served_by(picked, served)
        if status == 200:
            picked.first_token(is_ttft=False)  # a no-op when reported already: the prefill is done either way
        picked.flight.answered(picked.instance.id, None, Usage.from_dict(report.get("usage")))
    finally:
        picked.finish(str(status))
    return json_response({"route_id": request.match_info["route_id"], "instance": picked.instance.id})


async def routes_ctx(app: web.Application):
    app[ROUTES] = routes = OpenRoutes(app[CONFIG].request_timeout_s)
    yield
    routes.close()


def add_routes(app: web.Application) -> None:
    app.cleanup_ctx.append(routes_ctx)
    add_body_route(app, "/v1/route", handle_route)
    add_body_route(app, "/v1/route/{route_id}/first_token", handle_first_token)
    add_body_route(app, "/v1/route/{route_id}/finish", handle_finish)
