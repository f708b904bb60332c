"""Forward a prepared request to the chosen instance and relay the answer without buffering.

A connect error, a 5xx, or a stream that breaks before its first byte is retried on
the next-best instance (at most `max_retries` times). Once bytes have reached the
client, a broken upstream ends the stream with an SSE error event and [DONE].
Router-side load (in flight, queued prefill tokens) is kept per instance here.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

from router.cluster import Cluster
from router.errors import KVRouteError, Overloaded, Unavailable
from router.http import SSE_DONE, read_json, sse_error
from router.routing import Choice, Prepared, Router

log = logging.getLogger(__name__)

INSTANCE_HEADER = "x-kvroute-instance"
RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError)


class Dispatch:
    """Router-side load of one request on one instance, from dispatch to the end."""

    def __init__(self, router: Router, prepared: Prepared, choice: Choice) -> None:
        self.router, self.prepared, self.choice = router, prepared, choice
        self.inst = choice.instance
        self.uncached = choice.uncached_tokens
        self.sent = time.monotonic()
        self.first_seen = False
        self.ended = False
        self.inst.inflight += 1
        self.inst.queued_prefill_tokens += self.uncached
        router.metrics.inflight.labels(self.inst.id).set(self.inst.inflight)

    def first_byte(self, is_ttft: bool = True) -> None:
        """The prefill is done. `is_ttft=False` for whole (non-streamed) bodies, whose arrival
        time includes the decode and must not teach the policy a prefill rate."""
        if self.first_seen:
            return
        self.first_seen = True
        self.inst.queued_prefill_tokens -= self.uncached
        if is_ttft:
            ttft = time.monotonic() - self.sent
            self.router.metrics.ttft.observe(ttft)
            self.router.policy.on_first_token(self.prepared.route, self.inst.id, ttft, self.uncached)

    def end(self, status: str) -> None:
        if self.ended:
            return
        self.ended = True
        if not self.first_seen:
            self.inst.queued_prefill_tokens -= self.uncached
        self.inst.inflight -= 1
        m = self.router.metrics
        m.inflight.labels(self.inst.id).set(self.inst.inflight)
        m.requests.labels(self.inst.id, self.router.policy_name, status).inc()
        self.router.policy.on_finished(self.prepared.route, self.inst.id)


class Proxy:
    def __init__(self, router: Router, cluster: Cluster, session: aiohttp.ClientSession) -> None:
        self.router = router
        self.cluster = cluster
        self.session = session
        self.metrics = router.metrics
        self.disagg = None  # router.disagg.Disaggregation, when the cluster has prefill and decode engines

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await read_json(request)
        prepared = await self.router.prepare(body, kind)
        if self.disagg is not None and self.disagg.active(prepared.model):
            return await self.disagg.handle(request, body, prepared)
        return await self.forward(request, await request.read(), prepared,
                                  self.cluster.colocated_roles(prepared.model))

    async def forward(self, request: web.Request, raw: bytes, prepared: Prepared,
                      roles: tuple[str, ...] | None, exclude: tuple[str, ...] = ()) -> web.StreamResponse:
        """Send the request whole to one instance (of `roles`), retrying on the next-best."""
        tried: list[str] = list(exclude)
        last_error: KVRouteError = Unavailable("no instance could take the request")
        for attempt in range(self.cluster.config.max_retries + 1):
            if attempt:
                self.metrics.retries.inc()
            try:
                choice = await self.router.decide(prepared, exclude=tried, record=True, roles=roles)
            except Unavailable as e:
                last_error = e if not attempt else last_error
                break
            self._observe_choice(prepared, choice)
            dispatch = Dispatch(self.router, prepared, choice)
            try:
                result = await self._attempt(request, raw, prepared, dispatch)
            except BaseException:
                dispatch.end("error")
                raise
            if isinstance(result, web.StreamResponse):
                return result
            dispatch.end("retried")
            tried.append(choice.instance.id)
            last_error = result
        self.metrics.errors.labels("upstream").inc()
        raise last_error

    def _observe_choice(self, prepared: Prepared, choice: Choice) -> None:
        cached = choice.cached_tokens
        self.metrics.prompt_tokens.inc(prepared.num_tokens)
        self.metrics.cached_tokens.inc(cached)
        self.metrics.cached_ratio.observe(cached / prepared.num_tokens if prepared.num_tokens else 0.0)

    async def _attempt(self, request: web.Request, raw: bytes, prepared: Prepared,
                       dispatch: Dispatch) -> web.StreamResponse | KVRouteError:
        """Relay one attempt; a KVRouteError return means "try the next instance"."""
        inst = dispatch.inst
        timeout = aiohttp.ClientTimeout(total=None, connect=self.cluster.config.connect_timeout_s)
        try:
            upstream = await self.session.post(inst.url + request.path, data=raw, timeout=timeout,
                                               headers={"Content-Type": "application/json"})
        except RETRYABLE as e:
            self.cluster.report_failure(inst, f"request failed: {e!r}")
            return Unavailable(f"instance {inst.id} failed: {e!r}")
        try:
            if upstream.status >= 500:
                text = await upstream.text()
                log.warning("instance %s answered %d: %s", inst.id, upstream.status, text[:200])
                if upstream.status == 503 and "Retry-After" in upstream.headers:
                    return Overloaded(f"instance {inst.id} is overloaded",
                                      retry_after=float(upstream.headers["Retry-After"]))
                return Unavailable(f"instance {inst.id} answered HTTP {upstream.status}")
            if not prepared.request.stream or upstream.status != 200:
                body = await upstream.read()
                dispatch.first_byte(is_ttft=False)
                dispatch.end(str(upstream.status))
                return web.Response(body=body, status=upstream.status, headers=self._headers(upstream, inst.id))
            try:
                first = await upstream.content.readany()
            except RETRYABLE as e:
                self.cluster.report_failure(inst, f"stream broke before its first byte: {e!r}")
                return Unavailable(f"instance {inst.id} failed before the first byte")
            if not first:
                return Unavailable(f"instance {inst.id} closed the stream before the first byte")
            dispatch.first_byte()
            return await self._relay(request, upstream, first, dispatch)
        finally:
            upstream.close()

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse, first: bytes,
                     dispatch: Dispatch) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, headers=self._headers(upstream, dispatch.inst.id))
        await resp.prepare(request)
        await resp.write(first)
        status = "200"
        try:
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
        except RETRYABLE as e:
            status = "broken"
            self.cluster.report_failure(dispatch.inst, f"stream broke: {e!r}")
            await resp.write(sse_error(Unavailable(f"instance {dispatch.inst.id} failed mid-stream: {e!r}")))
            await resp.write(SSE_DONE)
        dispatch.end(status)
        await resp.write_eof()
        return resp

    @staticmethod
    def _headers(upstream: aiohttp.ClientResponse, instance_id: str) -> dict:
        headers = {INSTANCE_HEADER: instance_id}
        for name in ("Content-Type", "Cache-Control", "Retry-After"):
            if name in upstream.headers:
                headers[name] = upstream.headers[name]
        return headers
