"""Where an OpenAI request enters the proxy: read, then the stages of router/service/request_path.py,
served whole by one engine (router/service/proxy.py) or split into prefill and decode
(router/service/disagg.py)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web

from kvroute.router.contract.errors import KVRouteError
from kvroute.router.contract.http import ClientGone, parse_json, read_body, status_of
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.service.proxy import Proxy
from kvroute.router.service.request_path import Flight, RequestPath
from kvroute.router.service.steering import forwardable
from kvroute.router.service.tenant_book import TENANT_KEY

# The paths whose POSTs go to an engine, and the kind of body each takes: the proxy's routes
# (router/service/app.py) and what the endpoint picker routes (router/service/ext_proc/own_routes.py).
ROUTED = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}


class SplitServing(Protocol):
    """Serves a model's requests on a prefill engine then a decode engine, when it has both."""

    def active(self, model: str) -> bool: ...

    async def handle(self, request: web.Request, body: dict, flight: Flight) -> web.StreamResponse: ...


class Entry:
    def __init__(self, path: RequestPath, cluster: Cluster, proxy: Proxy, split: SplitServing) -> None:
        self.path, self.cluster, self.proxy, self.split = path, cluster, proxy, split

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Read, then prepare, admit and serve one request (decide, send, relay: the proxy's). Everything
        it charges (its tenant's slot from before it is tokenized, each attempt's instance) is its
        flight's, finished here whatever fails."""
        raw = await read_body(request, self.cluster.max_body_bytes)
        body, raw = forwardable(parse_json(raw), raw)
        flight = await self.path.prepare(body, kind, request.headers, request.get(TENANT_KEY), raw)
        status = "error"
        try:
            resp = await self._serve(request, flight.body, flight.raw, flight)
            status = str(resp.status)
            return resp
        except (asyncio.CancelledError, ClientGone):
            status = "cancelled"
            raise
        except KVRouteError as e:
            status = str(status_of(e))
            raise
        finally:
            flight.finish(status)

    async def _serve(self, request: web.Request, body: dict, raw: bytes, flight: Flight) -> web.StreamResponse:
        if self.split.active(flight.prepared.model):
            await self.path.admit(flight, None, predicts=False)
            return await self.split.handle(request, body, flight)
        roles = self.cluster.colocated_roles(flight.prepared.model)
        await self.path.admit(flight, roles)
        return await self.proxy.forward(request, raw, flight, roles)
