"""One request's way through the router, in named stages (docs/architecture.md#the-request-path).

    prepare  parse, limits, tenant (its slot taken first), tokenize, hash   Router.prepare
    admit    tenant limits, predicted TTFT against the SLO, the fair queue   AdmissionGate.enter
    decide   index lookup, candidates, the policy's choice, recorded at once  Router.decide
    send     the request on the wire to the chosen engine                   router/service/proxy.py
    relay    the answer back to the client                                  router/service/proxy.py
    finish   every charge released, then metrics and the recent window      Charges.close, Router.finish

A `Flight` is one request from prepare to finish: its record (`Prepared`), the owner of its
charges (`Charges`) and what admission predicted from. The HTTP proxy runs every stage; the
endpoint picker (router/service/ext_proc/) and the route-only API (router/service/route_api.py)
run prepare, admit and decide, charge the choice as sent (`charge`), and hear of the first token
and the finish from the data plane (`Flight.first_token`, `Flight.finish`). Each stage only
calls forward: nothing after the decision (the HTTP client least of all) calls into routing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from kvroute.router.contract.errors import KVRouteError
from kvroute.router.contract.http import status_of
from kvroute.router.decision.admission import NO_PREDICTION, Prediction
from kvroute.router.decision.base import Decision
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import Instance
from kvroute.router.service.admission_gate import AdmissionGate, Ticket, no_prediction
from kvroute.router.service.charges import Charges, Dispatch
from kvroute.router.service.request_class import priority_of, slo_of, within_priority
from kvroute.router.service.routing import Choice, Forecast, Prepared, Router
from kvroute.router.service.usage import Usage


class Flight:
    """One request from prepare to finish. `finish` ends it once: whatever it still charges is
    released (its owner of charges), then its metrics and the recent window are written."""

    __slots__ = ("router", "ticket", "charges", "prepared", "body", "raw", "forecast", "dispatch", "finished")

    def __init__(self, router: Router, ticket: Ticket, charges: Charges, prepared: Prepared, body: dict,
                 raw: bytes) -> None:
        self.router, self.ticket, self.charges, self.prepared = router, ticket, charges, prepared
        self.body, self.raw = body, raw  # what goes to the engine: the priority within the tenant's (prepare)
        self.forecast: Forecast | None = None  # admission's decision, taken by the next `decide`
        self.dispatch: Dispatch | None = None  # the attempt charged last
        self.finished = False

    def first_token(self, instance: str, is_ttft: bool = True) -> None:
        """The data plane saw the answer's first byte (`is_ttft=False`: a whole answer, whose
        arrival includes its decode)."""
        if self.dispatch is not None:
            self.dispatch.first_byte(is_ttft)
        if is_ttft:
            self.prepared.trace.first(instance)

    def relayed(self, chunk: bytes) -> None:
        """A chunk of a streamed answer went to the client (its SSE events and usage are read)."""
        self.prepared.trace.relayed(chunk)

    def answered(self, instance: str, whole: bytes | None, usage: Usage | None = None) -> None:
        """The answer came from `instance`; `whole`: a whole (non-streamed) answer's bytes, if seen;
        `usage`: the engine's, as a data plane reported it."""
        trace = self.prepared.trace
        if whole is not None:
            trace.body(whole, instance)
        elif not trace.instance:
            trace.instance = instance
        if usage is not None:
            trace.usage = usage

    def finish(self, status: str) -> None:
        if self.finished:
            return
        self.finished = True
        trace = self.prepared.trace
        self.charges.close(status, trace.first_token)
        # metrics and the recent window once the answer is on its way (next loop step)
        asyncio.get_running_loop().call_soon(self.router.finish, trace, status)


class Kept:
    """Admission's prediction, from the decision it would make now; the decision is kept on the
    flight, and the `decide` right after (same event-loop step) takes it instead of making it again."""

    __slots__ = ("router", "flight", "roles")

    def __init__(self, router: Router, flight: Flight, roles) -> None:
        self.router, self.flight, self.roles = router, flight, roles

    async def __call__(self) -> Prediction:
        forecast = self.flight.forecast = await self.router.forecast(self.flight.prepared, self.roles)
        return forecast.prediction if forecast is not None else NO_PREDICTION


class RequestPath:
    """The stages every front door shares: one of each, over the router's one decision."""

    def __init__(self, router: Router, cluster: Cluster, gate: AdmissionGate) -> None:
        self.router, self.cluster, self.gate = router, cluster, gate

    def ticket(self, body: dict, headers: Mapping[str, str], key_tenant: str | None) -> Ticket:
        """The request's admission ticket: its tenant (key, trusted header or default), band and SLO."""
        tenant = self.gate.book.tenant_of(headers, key_tenant)
        return self.gate.ticket(tenant, priority_of(body, headers), slo_of(headers))

    async def prepare(self, body: dict, kind: str, headers: Mapping[str, str],
                      key_tenant: str | None = None, raw: bytes = b"") -> Flight:
        """The tenant's slot (Overloaded when its limits refuse), then parse, limits, tokenize, hash.
        A failure here gives the slot back before it propagates (no flight was made). The body (and
        `raw`, its bytes) has its priority lowered to the tenant's `min_priority` first
        (router/service/request_class.py `within_priority`): the flight's `body` and `raw` are what
        the engine gets."""
        ticket = self.ticket(body, headers, key_tenant)
        body, raw = within_priority(body, raw, ticket.spec.min_priority)
        charges = Charges(self.gate, ticket)
        try:
            charges.reserve()
            prepared = await self.router.prepare(body, kind, tenant=ticket.spec.name)
        except BaseException as e:
            charges.close(status_label(e))
            raise
        self.router.recent.arrived(prepared.trace)
        return Flight(self.router, ticket, charges, prepared, body, raw)

    async def admit(self, flight: Flight, roles: Sequence[str] | None, predicts: bool = True) -> None:
        """Return once admitted (Overloaded when refused). `predicts=False`: the limits alone
        (disaggregated serving, whose TTFT admission does not predict)."""
        if not self.gate.gated(flight.ticket):
            return  # `enter` admits at once: nothing to make for it
        predict = Kept(self.router, flight, roles) if predicts else no_prediction
        await self.gate.enter(flight.ticket, predict)

    async def decide(self, flight: Flight, roles: Sequence[str] | None, exclude: Sequence[str] = ()) -> Choice:
        """Pick an instance (none of `exclude`) and record the choice: the policy, the recent senders,
        the cache metrics. Unavailable or Overloaded when no instance can take the request."""
        forecast, flight.forecast = flight.forecast, None
        prepared = flight.prepared
        choice = await self.router.decide(prepared, exclude=exclude, record=True, roles=roles, forecast=forecast)
        self.router.observe_choice(prepared, choice)
        return choice

    def charge(self, flight: Flight, choice: Choice) -> Dispatch:
        """Charge `choice`'s instance with the request as sent, owned by the flight until it ends."""
        whole = not flight.prepared.request.stream
        flight.dispatch = flight.charges.dispatch(self.router, flight.prepared, choice, whole_body=whole)
        return flight.dispatch

    def moved(self, flight: Flight, choice: Choice, inst: Instance) -> Dispatch:
        """The data plane sent the request to `inst` after `choice` failed (its fallback): the failed
        attempt's charge ends as retried and the policy hears of the failure, as on a proxy retry; the
        policy learns the new choice and `inst` is charged."""
        prepared = flight.prepared
        if flight.dispatch is not None:
            flight.dispatch.end("retried")
        self.router.policy.on_failed(prepared.route, choice.instance.id)
        self.router.decision.routed(prepared.route, inst.id, self.router.clock())
        moved = Choice(instance=inst, decision=Decision(instance=inst.id), matches=choice.matches, candidates=[inst],
                       prepared_tokens=prepared.num_tokens)
        return self.charge(flight, moved)


def status_label(e: BaseException) -> str:
    """How a request that ended by `e` is counted: its HTTP status, cancelled, or error."""
    if isinstance(e, KVRouteError):
        return str(status_of(e))
    return "cancelled" if isinstance(e, asyncio.CancelledError) else "error"
