"""The router as an endpoint picker: the stages prepare, admit and decide of the request path
(router/service/request_path.py), the choice charged as sent, and nothing sent. Another data plane
sends and relays, and reports the first token and the finish (`Picked.first_token`,
`Picked.finish`); the Envoy ext_proc server (router/service/ext_proc/) and the route-only API
(router/service/route_api.py) are its two drivers.

A pick answers the chosen instance and, in order, the next best ones as fallbacks (at most
--max-retries, as the proxy would retry: the policy's costs, cheapest first). `among`: the
endpoints (`ip:port`) a data plane allows (Envoy's subset hint): only those are candidates, and
a request none of them can take is Unavailable (503).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvroute.router.contract.errors import Unavailable
from kvroute.router.decision.admission import predicted_ttft
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import Instance
from kvroute.router.service.endpoints import Endpoints
from kvroute.router.service.request_path import Flight, RequestPath, status_label
from kvroute.router.service.routing import Choice


class Picked:
    """One picked request: its flight (its charges) and the choice, until the data plane says it ended."""

    __slots__ = ("flight", "choice", "fallbacks", "instance")

    def __init__(self, flight: Flight, choice: Choice, fallbacks: Sequence[Instance]) -> None:
        self.flight, self.choice, self.fallbacks = flight, choice, fallbacks
        self.instance = choice.instance  # the one charged: the choice, or the fallback that served it

    @property
    def predicted_ttft_s(self) -> float | None:
        return predicted_ttft(self.choice.decision).ttft_s

    def first_token(self, is_ttft: bool = True) -> None:
        self.flight.first_token(self.instance.id, is_ttft)

    def finish(self, status: str) -> None:
        self.flight.finish(status)


class Picker:
    def __init__(self, path: RequestPath, cluster: Cluster, endpoints: Endpoints) -> None:
        self.path, self.cluster, self.endpoints = path, cluster, endpoints

    async def pick(self, body: dict, kind: str, headers: Mapping[str, str], key_tenant: str | None = None,
                   among: Sequence[str] | None = None, raw: bytes = b"") -> Picked:
        """Prepare, admit and decide; the choice charged as sent (the body to send, `raw` with its
        priority within the tenant's, is the flight's). A refusal or failure finishes the flight
        (nothing stays charged) and propagates: Overloaded (429/503), Unavailable, BadRequest."""
        flight = await self.path.prepare(body, kind, headers, key_tenant, raw)
        try:
            roles = self.cluster.colocated_roles(flight.prepared.model)
            exclude = self._outside(flight.prepared.model, roles, among)
            await self.path.admit(flight, roles)
            choice = await self.path.decide(flight, roles, exclude)
            self.path.charge(flight, choice)
        except BaseException as e:
            flight.finish(status_label(e))
            raise
        return Picked(flight, choice, self._fallbacks(choice, exclude))

    def served_by(self, picked: Picked, endpoint: str) -> None:
        """The data plane says `endpoint` served the request (a fallback after the choice failed): the
        charge moves there, and the policy hears that the choice failed."""
        if not endpoint or self.endpoints.of(picked.instance.url) == endpoint:
            return
        for inst in picked.fallbacks:
            if self.endpoints.of(inst.url) == endpoint:
                self.path.moved(picked.flight, picked.choice, inst)
                picked.instance = inst
                return

    def endpoint(self, inst: Instance) -> str:
        return self.endpoints.of(inst.url)

    def _outside(self, model: str, roles, among: Sequence[str] | None) -> tuple[str, ...]:
        """The routable instances a subset hint leaves out; Unavailable when it leaves none."""
        if among is None:
            return ()
        members = self.cluster.routable(model, roles)
        allowed = self.endpoints.among(members, among)
        if not allowed:
            raise Unavailable(f"none of the endpoints the gateway allows ({', '.join(among)[:200] or 'none'}) "
                              f"is a routable instance of {model!r}")
        return tuple(inst.id for inst in members if inst.id not in allowed)

    def _fallbacks(self, choice: Choice, exclude: Sequence[str]) -> list[Instance]:
        costs = choice.decision.costs
        others = [inst for inst in choice.candidates
                  if inst.id != choice.instance.id and inst.id not in exclude and inst.routable]
        others.sort(key=lambda inst: costs.get(inst.id, math.inf))
        return others[: self.cluster.config.max_retries]
