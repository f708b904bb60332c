"""Prefill/decode disaggregation in the router: prefill here, decode there, one stream back.

With prefill-role and decode-role engines in the cluster, a request whose uncached
prompt (on the best prefill engine) is at least `pd_min_uncached` tokens goes:

  1. to a prefill engine chosen by the routing policy (KV-aware cost), with
     `kv_transfer_params: {"do_remote_decode": true}`: it computes the prompt and the
     first token and answers with a transfer handle (its blocks stay pinned);
  2. the first token goes to the client at once (TTFT does not wait for the transfer);
  3. to a decode engine chosen by decode load (fewest requests, then KV usage), with
     the original request and the handle: it pulls the K/V and streams the rest.

Shorter uncached prompts skip step 1 and go whole to a decode engine (chosen by the
policy: decode engines cache prefixes too). A prefill failure before any token reached
the client is retried on another prefill engine, then whole on a decode engine. A whole
(non-streamed) request whose decode engine fails before answering is retried on another
decode engine, with the handle while it is valid, else whole.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Collection

import orjson
from aiohttp import web

from kvroute.router.contract.errors import KVRouteError, Unavailable
from kvroute.router.contract.http import (
    SSE_DONE,
    ClientGone,
    json_response,
    prepare_client,
    sse_error,
    sse_line,
    write_client,
)
from kvroute.router.contract.kv_auth import make_grant
from kvroute.router.decision.base import Decision
from kvroute.router.decision.decode_choice import DECODE_ROLES, PREFILL_ROLES, disaggregated, pick_decode_member
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import Instance
from kvroute.router.fleet.upstream_errors import describe_failure
from kvroute.router.service.charges import Charges, Dispatch
from kvroute.router.service.prefilled import first_chunk, parse_prefilled, usage_chunk, valid_handle
from kvroute.router.service.proxy import INSTANCE_HEADER, RETRYABLE, Proxy
from kvroute.router.service.request_path import Flight
from kvroute.router.service.routing import Choice, Prepared
from kvroute.router.service.steering import with_token_ids

log = logging.getLogger(__name__)

PREFILL_HEADER = "x-kvroute-prefill-instance"


def pick_decode(cluster: Cluster, model: str, rng: random.Random, exclude: Collection[str] = ()) -> Instance:
    """Decode load: fewest requests (router in-flight, engine running + waiting), then KV usage
    (router/decision/decode_choice.py, the simulator's rule too); none of `exclude` (tried already)."""
    picked = pick_decode_member(cluster.group(model, DECODE_ROLES), rng, exclude)
    if picked is None:
        what = " that was not tried already" if exclude else ""
        raise Unavailable(f"no healthy decode instance serves {model!r}{what}")
    return picked


class Disaggregation:
    def __init__(self, proxy: Proxy, min_uncached: int, rng: random.Random | None = None,
                 secret: str | None = None) -> None:
        self.proxy = proxy
        self.secret = secret  # signs the grants that let prefill engines pin K/V (router/contract/kv_auth.py)
        self._refused_logged = False
        self.router = proxy.router
        self.cluster: Cluster = proxy.cluster
        self.min_uncached = min_uncached
        self.rng = rng or random.Random()

    def active(self, model: str) -> bool:
        return disaggregated(lambda roles: bool(self.cluster.routable(model, roles)))

    async def plan(self, prepared: Prepared, exclude: tuple[str, ...] = (), record: bool = True) -> Choice | None:
        """The prefill choice, or None to skip the prefill stage (router/decision/route.py
        `plan_prefill`, the simulator's too); the decode engine is picked when the prefill is done."""
        group = self.cluster.group(prepared.model, PREFILL_ROLES)
        matches = await self.router.lookup(prepared)
        routed = self.router.decision.plan_prefill(prepared.route, group, matches, self.router.clock(),
                                                   self.min_uncached, exclude, record)
        return None if routed is None else self.router.choice(prepared, routed, matches)

    async def explain(self, prepared: Prepared) -> dict:
        prefill = await self.plan(prepared, record=False)
        decode = pick_decode(self.cluster, prepared.model, self.rng)
        out = {"disaggregated": prefill is not None, "pd_min_uncached": self.min_uncached, "decode": {
            "choice": decode.id, "candidates": [{"instance": i.id, "inflight": i.inflight,
                                                 "load": i.load.to_dict() if i.load else None}
                                                for i in self.cluster.routable(prepared.model, DECODE_ROLES)]}}
        if prefill is not None:
            out["prefill"] = self.router.explain(prepared, prefill)
        return out

    async def handle(self, request: web.Request, body: dict, flight: Flight) -> web.StreamResponse:
        """Serve the request in two stages; each stage's charge on its engine is the flight's
        (router/service/request_path.py), released by it whatever fails."""
        prepared, charges = flight.prepared, flight.charges
        tried: list[str] = []
        for _ in range(self.cluster.config.max_retries + 1):
            prefill = await self.plan(prepared, exclude=tuple(tried))
            if prefill is None:
                break
            result = await self._prefill(request, body, prepared, prefill, charges)
            if isinstance(result, web.StreamResponse):
                return result
            if isinstance(result, dict):
                # Decode load is read now, not at arrival: requests whose prefills overlapped
                # would otherwise all pick the decode engine that was idlest back then.
                decode = pick_decode(self.cluster, prepared.model, self.rng)
                if not prepared.request.stream:
                    return await self._decode_whole(request, body, flight, decode, result)
                return await self._decode(request, body, prepared, prefill.instance, decode, result, charges)
            tried.append(prefill.instance.id)
            self.router.metrics.retries.inc()
        # Short uncached prompt, or no prefill engine could take it: whole on a decode engine.
        return await self.proxy.forward(request, orjson.dumps(body), flight, DECODE_ROLES)

    async def _prefill(self, request: web.Request, body: dict, prepared: Prepared, choice: Choice,
                       charges: Charges) -> dict | web.StreamResponse | None:
        """The prefill's JSON (with a handle); a final response to relay; None to retry elsewhere."""
        inst = choice.instance
        grant = make_grant(self.secret, inst.id, inst.url)
        p_body = {**body, "stream": False, "kv_transfer_params": grant}
        if self.proxy._tokenizes_like_us(inst, prepared):  # the prefill engine need not tokenize again
            p_body = orjson.loads(with_token_ids(p_body, prepared.request.kind, prepared.token_ids))
        self.router.observe_choice(prepared, choice)
        dispatch = charges.dispatch(self.router, prepared, choice)
        wait = self.cluster.config.first_byte_timeout_s
        try:
            async with asyncio.timeout(wait):
                async with self.proxy.client.post(inst.url + request.path, json=p_body,
                                                   timeout=self.proxy.client_timeout()) as r:
                    data = await r.read()
                    status = r.status
        except (asyncio.CancelledError, ClientGone):
            dispatch.end("cancelled")
            raise
        except RETRYABLE as e:
            dispatch.end("error")
            why = f"no prefill answer within {wait:g}s" if isinstance(e, TimeoutError) else describe_failure(e)
            self.cluster.report_failure(inst, f"prefill failed: {why}", request=True)
            return None
        dispatch.first_byte()
        dispatch.end(str(status))
        if status >= 500 or status == 403:
            if status == 403 and not self._refused_logged:
                self._refused_logged = True
                log.error("prefill instance %s refused the transfer grant (%s): give the router and every "
                          "engine the same --kv-secret; sending requests whole to decode engines meanwhile",
                          inst.id, data[:200].decode(errors="replace"))
            log.warning("prefill instance %s answered %d", inst.id, status)
            return None
        if status != 200:
            return web.Response(body=data, status=status, content_type="application/json",
                                headers={INSTANCE_HEADER: inst.id})
        prefilled = parse_prefilled(data)
        if prefilled is None:
            self.cluster.report_failure(inst, "malformed prefill answer", request=True, exclude=False)
            return None
        inst.request_ok()
        params = prefilled.get("kv_transfer_params")
        if not params:  # it ended at the first token (a stop token): that is the whole answer
            return await self._finished_at_prefill(request, prepared, inst, prefilled)
        if not params["handle"].get("address"):  # unsigned (peer-trust) handles: the router names it
            params["handle"]["address"] = inst.url
        return prefilled

    async def _finished_at_prefill(self, request, prepared, inst: Instance, prefilled: dict) -> web.StreamResponse:
        headers = {INSTANCE_HEADER: inst.id, PREFILL_HEADER: inst.id}
        if not prepared.request.stream:
            prepared.trace.body(orjson.dumps(prefilled), inst.id)
            return json_response(prefilled, headers=headers)
        prepared.trace.first(inst.id)
        reason = prefilled["choices"][0].get("finish_reason")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await prepare_client(resp, request)
        kind = prepared.request.kind
        tail = sse_line(usage_chunk(kind, prefilled)) if prepared.request.include_usage else b""
        await write_client(resp, sse_line(first_chunk(kind, prefilled, reason)) + tail + SSE_DONE)
        await write_client(resp)
        return resp

    async def _decode_whole(self, request: web.Request, body: dict, flight: Flight, decode: Instance,
                            prefilled: dict) -> web.StreamResponse:
        """A whole (non-streamed) answer from a decode engine. One that fails before answering is
        replaced, as a colocated attempt is, by the next decode engine by decode load among those not
        tried; the handle goes with it while it is valid (a decode engine whose pull finds the blocks
        gone computes the prompt itself), else the request goes whole."""
        prepared = flight.prepared
        last: KVRouteError | None = None
        tried: list[str] = []
        for attempt in range(self.cluster.config.max_retries + 1):
            if attempt:
                try:
                    decode = pick_decode(self.cluster, prepared.model, self.rng, exclude=tried)
                except Unavailable:
                    break
                self.router.metrics.retries.inc()
            params = valid_handle(prefilled)
            raw = orjson.dumps({**body, "kv_transfer_params": params} if params else body)
            result = await self.proxy.attempt(request, raw, flight, _decode_choice(prepared, decode, params))
            if isinstance(result, web.StreamResponse):
                return result
            tried.append(decode.id)
            last = result
        self.router.metrics.errors.labels("upstream").inc()
        raise last or Unavailable(f"no decode instance could take the request for {prepared.model!r}")

    async def _decode(self, request: web.Request, body: dict, prepared: Prepared, prefill: Instance,
                      decode: Instance, prefilled: dict, charges: Charges) -> web.StreamResponse:
        d_body = orjson.dumps({**body, "kv_transfer_params": prefilled["kv_transfer_params"]})
        headers = {INSTANCE_HEADER: decode.id, PREFILL_HEADER: prefill.id}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **headers})
        await prepare_client(resp, request)
        prepared.trace.first(prefill.id)
        await write_client(resp, sse_line(first_chunk(prepared.request.kind, prefilled)))
        prepared.trace.first(decode.id)  # the tokens after the first come from the decode engine
        dispatch = charges.dispatch(self.router, prepared, _decode_choice(prepared, decode, handle=True))
        status = "200"
        try:
            status = await self._decode_stream(request, d_body, decode, resp, dispatch)
        except (asyncio.CancelledError, ClientGone):
            status = "cancelled"
            raise
        except (*RETRYABLE, _UpstreamStatus) as e:
            status = "broken"
            if isinstance(e, _UpstreamStatus):
                err = e.error
            else:
                why = "no first byte in time" if isinstance(e, TimeoutError) else describe_failure(e)
                self.cluster.report_failure(decode, f"decode failed: {why}", request=True)
                err = Unavailable(f"decode {decode.id} failed: {why}")
            await write_client(resp, sse_error(err) + SSE_DONE)
        finally:
            dispatch.end(status)
        await write_client(resp)
        return resp

    async def _decode_stream(self, request: web.Request, d_body: bytes, decode: Instance,
                             resp: web.StreamResponse, dispatch: Dispatch) -> str:
        async with asyncio.timeout(self.cluster.config.first_byte_timeout_s):
            r = await self.proxy.client.post(decode.url + request.path, data=d_body,
                                              timeout=self.proxy.client_timeout(),
                                              headers={"Content-Type": "application/json"})
        try:
            if r.status != 200:
                raise _UpstreamStatus(r.status, await r.content.read(300))
            dispatch.first_byte()
            decode.request_ok()
            return await self.proxy.pump(r, resp, decode, dispatch.prepared.trace)
        finally:
            r.close()


def _decode_choice(prepared: Prepared, decode: Instance, handle) -> Choice:
    """The decode stage's choice, charged with no prefill when it has a handle, else the whole prompt."""
    return Choice(instance=decode, decision=Decision(instance=decode.id, uncached_tokens=0 if handle else None),
                  matches={}, candidates=[decode], prepared_tokens=prepared.num_tokens)


class _UpstreamStatus(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status)
        try:
            message = orjson.loads(body)["error"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = body.decode(errors="replace")
        self.error = KVRouteError(f"decode instance answered HTTP {status}: {message}")

