"""Where an OpenAI request enters: read and prepared once, then served whole by one engine
(router/service/proxy.py) or split into prefill and decode (router/service/disagg.py)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web

from kvroute.router.contract.errors import KVRouteError
from kvroute.router.contract.http import ClientGone, parse_json, read_body, status_of
from kvroute.router.decision.admission import NO_PREDICTION, Prediction
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.service.admission_gate import AdmissionGate, Ticket, no_prediction
from kvroute.router.service.charges import Charges
from kvroute.router.service.proxy import Proxy
from kvroute.router.service.request_class import priority_of, slo_of, within_priority
from kvroute.router.service.routing import Forecast, Prepared, Router
from kvroute.router.service.steering import forwardable
from kvroute.router.service.tenant_book import TENANT_KEY


class SplitServing(Protocol):
    """Serves a model's requests on a prefill engine then a decode engine, when it has both."""

    def active(self, model: str) -> bool: ...

    async def handle(self, request: web.Request, body: dict, prepared: Prepared,
                     charges: Charges) -> web.StreamResponse: ...


class Kept:
    """The last decision admission predicted from: the gate returns in the event-loop step of its
    last prediction, so the dispatch right after it takes that decision instead of making it again."""

    __slots__ = ("forecast",)

    def __init__(self) -> None:
        self.forecast: Forecast | None = None

    async def predict(self, router: Router, prepared: Prepared, roles) -> Prediction:
        self.forecast = await router.forecast(prepared, roles)
        return self.forecast.prediction if self.forecast is not None else NO_PREDICTION


class Entry:
    def __init__(self, router: Router, cluster: Cluster, proxy: Proxy, split: SplitServing,
                 gate: AdmissionGate) -> None:
        self.router, self.cluster, self.proxy, self.split, self.gate = router, cluster, proxy, split, gate

    def ticket(self, request: web.Request, body: dict) -> Ticket:
        tenant = self.gate.book.tenant_of(request.headers, request.get(TENANT_KEY))
        return self.gate.ticket(tenant, priority_of(body, request.headers), slo_of(request.headers))

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Read, prepare and serve one request. Everything it charges (its tenant's slot from before it
        is tokenized, each attempt's instance) is owned by one `Charges`, released here whatever fails."""
        raw = await read_body(request, self.cluster.max_body_bytes)
        body, raw = forwardable(parse_json(raw), raw)
        ticket = self.ticket(request, body)
        body, raw = within_priority(body, raw, ticket.spec.min_priority)
        charges = Charges(self.gate, ticket)
        trace, status = None, "error"
        try:
            charges.reserve()
            prepared = await self.router.prepare(body, kind, tenant=ticket.spec.name)
            trace = prepared.trace
            self.router.recent.arrived(trace)
            resp = await self._serve(request, body, raw, prepared, ticket, charges)
            status = str(resp.status)
            return resp
        except (asyncio.CancelledError, ClientGone):
            status = "cancelled"
            raise
        except KVRouteError as e:
            status = str(status_of(e))
            raise
        finally:
            charges.close(status, trace.first_token if trace is not None else None)
            if trace is not None:  # metrics and the recent window once the answer is on its way (next loop step)
                asyncio.get_running_loop().call_soon(self.router.finish, trace, status)

    async def _serve(self, request: web.Request, body: dict, raw: bytes, prepared: Prepared, ticket: Ticket,
                     charges: Charges) -> web.StreamResponse:
        gated = self.gate.gated(ticket)  # else `enter` admits at once: nothing to make for it
        if self.split.active(prepared.model):
            if gated:
                await self.gate.enter(ticket, no_prediction)
            return await self.split.handle(request, body, prepared, charges)
        roles = self.cluster.colocated_roles(prepared.model)
        forecast = None
        if gated:
            kept = Kept()
            await self.gate.enter(ticket, lambda: kept.predict(self.router, prepared, roles))
            forecast = kept.forecast
        return await self.proxy.forward(request, raw, prepared, roles, charges, forecast=forecast)
