"""Forward a prepared request to the chosen instance and relay the answer without buffering.

A connect error, a 5xx, a timeout, or a stream that breaks before its first byte is
retried on the next-best instance (at most `max_retries` times). Once bytes have
reached the client, a broken upstream ends the stream with an SSE error event and
[DONE]. Every upstream wait is bounded: the first byte of a stream by
`first_byte_timeout_s`, each later chunk by `read_timeout_s`, a whole non-streamed
answer by `request_timeout_s` while the engine's load reports show it moving and by
`first_byte_timeout_s` without progress when they stop or stand still (a hung engine,
router/fleet/progress.py); a timeout counts as a failure of that engine.

Blame: upstream reads and client writes are kept apart. A client that leaves (a
write to its closed connection, or the handler cancelled by aiohttp) ends the
request as `cancelled` and never counts against the engine.
Router-side load (in flight, queued prefill tokens) is charged per attempt through the
request's flight (router/service/request_path.py), whose owner of charges releases whatever a
failure leaves. Each attempt's decision is recorded before it is sent: the HTTP client knows
nothing of routing.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from kvroute.router.contract.errors import KVRouteError, Overloaded, Unavailable
from kvroute.router.contract.http import (
    SSE_DONE,
    parse_retry_after,
    prepare_client,
    sse_error,
    write_client,
)
from kvroute.router.fleet.kinds.http import plain_target
from kvroute.router.fleet.upstream_errors import describe_failure
from kvroute.router.service.attempt_deadlines import Deadlines
from kvroute.router.service.charges import Dispatch
from kvroute.router.service.request_path import Flight, RequestPath
from kvroute.router.service.routing import Choice, Prepared
from kvroute.router.service.steering import with_token_ids
from kvroute.router.service.upstream import Upstream

log = logging.getLogger(__name__)

INSTANCE_HEADER = "x-kvroute-instance"
RELAYED_HEADERS = ("Content-Type", "Cache-Control", "Retry-After")  # of the engine's answer, to the client
RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError)


class Proxy:
    """The proxy's stages: decide (the request path's, once per attempt), send, relay."""

    def __init__(self, path: RequestPath, session: aiohttp.ClientSession | None) -> None:
        self.path = path
        self.router = path.router
        self.cluster = path.cluster
        self.session = session
        self.deadlines = Deadlines()  # the attempts' deadlines, on one timer (router/service/attempt_deadlines.py)
        self.upstream = Upstream()  # plain-http engines: the lean client (router/service/upstream.py)
        self.metrics = path.router.metrics
        self.config = path.cluster.config

    async def forward(self, request: web.Request, raw: bytes, flight: Flight,
                      roles: tuple[str, ...] | None) -> web.StreamResponse:
        """Send the request whole to one instance (of `roles`), retrying on the next-best: each attempt
        decided (recorded before it is sent), charged on its instance (the flight's until it ends),
        sent and relayed. An engine that tokenizes as the router does gets the router's token ids."""
        prepared = flight.prepared
        tried: list[str] = []
        bodies = {False: raw}
        last_error: KVRouteError | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.metrics.retries.inc()
            try:
                choice = await self.path.decide(flight, roles, exclude=tried)
            except Unavailable as e:
                last_error = e if not attempt else last_error
                break
            result = await self.attempt(request, self._body_for(choice.instance, prepared, bodies), flight, choice)
            if isinstance(result, web.StreamResponse):
                return result
            tried.append(choice.instance.id)
            last_error = result
        self.metrics.errors.labels("upstream").inc()
        raise last_error or Unavailable("no instance could take the request")

    async def attempt(self, request: web.Request, raw: bytes, flight: Flight,
                      choice: Choice) -> web.StreamResponse | KVRouteError:
        """One attempt on `choice`'s instance: the answer, or the error to retry elsewhere on (the
        attempt's charge released, the policy told)."""
        dispatch = self.path.charge(flight, choice)
        result = await self._attempt(request, raw, flight.prepared, dispatch)
        if isinstance(result, KVRouteError):
            dispatch.end("retried")
            self.router.policy.on_failed(flight.prepared.route, choice.instance.id)
        return result

    def _body_for(self, inst, prepared: Prepared, bodies: dict[bool, bytes]) -> bytes:
        """The bytes for `inst`: the router's token ids where it tokenizes as the router does (made once)."""
        ids = self._tokenizes_like_us(inst, prepared)
        if ids not in bodies:
            bodies[ids] = with_token_ids(prepared.request.body, prepared.request.kind, prepared.token_ids)
        return bodies[ids]

    def _tokenizes_like_us(self, inst, prepared: Prepared) -> bool:
        info = inst.info
        return (inst.kind == "kvroute" and info is not None and info.tokenizer == self.cluster.tokenizer_fingerprint
                and prepared.request.prompt_ids is None and bool(prepared.token_ids)
                and not prepared.keys.images and prepared.keys.hashable_tokens < 0)  # image runs: the engine's

    @property
    def client(self) -> aiohttp.ClientSession:
        """The app's HTTP client session (a proxy made without one, in a test, never sends)."""
        assert self.session is not None
        return self.session

    def client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s,
                                     sock_read=self.config.read_timeout_s)

    @staticmethod
    def _address(url: str) -> tuple[str, int, str] | None:
        """(host, port, path prefix) of a plain-http engine URL, by the rule the load polls follow
        (router/fleet/kinds/http.py `plain_target`); None: aiohttp sends it (https, credentials)."""
        target = plain_target(url)
        return None if target is None else (target[0], target[1], target[2].rstrip("/"))

    async def _post(self, url: str, path: str, raw: bytes, stream: bool):
        """POST to an engine; the answer's head is in. Non-streamed answers arrive whole at the end,
        so only a stream's reads are bounded by --read-timeout-s (a whole body by the caller)."""
        address = self._address(url)
        if address is None:
            timeout = self.client_timeout() if stream else aiohttp.ClientTimeout(
                total=None, connect=self.config.connect_timeout_s)
            return await self.client.post(url + path, data=raw, timeout=timeout,
                                           headers={"Content-Type": "application/json"})
        host, port, prefix = address
        read_timeout = self.config.read_timeout_s if stream else None  # a whole body: the attempt's deadline
        return await self.upstream.post(host, port, prefix + path, raw, self.config.connect_timeout_s, read_timeout)

    async def _attempt(self, request: web.Request, raw: bytes, prepared: Prepared,
                       dispatch: Dispatch) -> web.StreamResponse | KVRouteError:
        """Send and relay one attempt; a KVRouteError return means "try the next instance"."""
        inst, stream = dispatch.inst, prepared.request.stream
        wait = self.config.first_byte_timeout_s if stream else self.config.request_timeout_s
        upstream = None
        # a non-streamed answer comes whole at the end: while the engine's load reports show it moving it
        # is working, and only --request-timeout-s bounds the wait; after --first-byte-timeout-s without
        # progress (hung, stopped) it ends at once, retried before anything reached the client
        deadline = self.deadlines.start(wait) if stream else self.deadlines.start(
            wait, inst, self.config.first_byte_timeout_s)
        try:
            with deadline:
                if not stream:
                    upstream, body = await self._fetch_whole(inst, request.path, raw)
                    if isinstance(body, KVRouteError):
                        return body
                else:
                    upstream = await self._post(inst.url, request.path, raw, stream)
                    if upstream.status >= 500:
                        return await self._server_error(inst, upstream)
                    if upstream.status != 200:
                        body = await upstream.read()
                    else:
                        first = await upstream.content.readany()
                        if not first:
                            self.cluster.report_failure(inst, "closed the stream before its first byte",
                                                        request=True)
                            return Unavailable(f"instance {inst.id} closed the stream before the first byte")
        except TimeoutError:
            if deadline.silent_s is not None:  # the engine went silent: hung or stopped
                why = f"no answer and {deadline.silence} for {deadline.silent_s:.1f}s"
                self.cluster.report_failure(inst, why, request=True)
                return Unavailable(f"instance {inst.id} timed out ({why}, --first-byte-timeout-s)")
            what = "no first byte" if stream else "no answer"
            flag = "--first-byte-timeout-s" if stream else "--request-timeout-s"
            self.cluster.report_failure(inst, f"{what} within {wait:g}s", request=True)
            return Unavailable(f"instance {inst.id} timed out ({what} within {wait:g}s, {flag})")
        except RETRYABLE as e:
            why = describe_failure(e)
            self.cluster.report_failure(inst, f"request failed: {why}", request=True)
            return Unavailable(f"instance {inst.id} failed: {why}")
        finally:
            if upstream is not None and (not stream or upstream.status != 200):
                upstream.close()
        inst.request_ok()
        if not stream or upstream.status != 200:
            prepared.trace.body(body, inst.id)
            dispatch.first_byte(is_ttft=False)
            dispatch.end(str(upstream.status))
            return web.Response(body=body, status=upstream.status,
                                headers=self._headers(upstream, inst.id, self.router.loss.headers(prepared.trace)))
        dispatch.first_byte()
        prepared.trace.first(inst.id)
        prepared.trace.relayed(first)
        try:
            return await self._relay(request, upstream, first, dispatch)
        finally:
            upstream.close()

    async def _fetch_whole(self, inst, path: str, raw: bytes):
        """(upstream, body) of a non-streamed answer, or (upstream, the error) for a 5xx."""
        upstream = None
        try:
            upstream = await self._post(inst.url, path, raw, False)
            if upstream.status >= 500:
                return upstream, await self._server_error(inst, upstream)
            return upstream, await upstream.read()
        except BaseException:
            if upstream is not None:
                upstream.close()
            raise

    async def _server_error(self, inst, upstream) -> KVRouteError:
        text = (await upstream.content.read(2048)).decode(errors="replace")
        log.warning("instance %s answered %d: %s", inst.id, upstream.status, text[:200])
        if upstream.status != 503:
            self.cluster.report_failure(inst, f"answered HTTP {upstream.status}", request=True, exclude=False)
        elif "Retry-After" in upstream.headers:
            return Overloaded(f"instance {inst.id} is overloaded",
                              retry_after=parse_retry_after(upstream.headers["Retry-After"]))
        return Unavailable(f"instance {inst.id} answered HTTP {upstream.status}")

    async def _relay(self, request: web.Request, upstream, first: bytes,
                     dispatch: Dispatch) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, headers=self._headers(
            upstream, dispatch.inst.id, self.router.loss.headers(dispatch.prepared.trace)))
        await prepare_client(resp, request)
        await write_client(resp, first)
        status = await self.pump(upstream, resp, dispatch.inst, dispatch.prepared.trace)
        dispatch.end(status)
        await write_client(resp)
        return resp

    async def pump(self, upstream, resp: web.StreamResponse, inst, trace) -> str:
        """Copy the rest of an upstream stream to the client; the outcome as a status label.
        A broken or stalled upstream is the engine's fault (SSE error, then [DONE]);
        a failed write is the client's (ClientGone propagates)."""
        while True:
            try:
                chunk = await upstream.content.readany()
            except RETRYABLE as e:
                why = f"no chunk within {self.config.read_timeout_s:g}s" if isinstance(
                    e, asyncio.TimeoutError) else f"stream broke: {describe_failure(e)}"
                self.cluster.report_failure(inst, why, request=True)
                await write_client(resp, sse_error(Unavailable(f"instance {inst.id} failed mid-stream: {why}")))
                await write_client(resp, SSE_DONE)
                return "broken"
            if not chunk:
                return "200"
            trace.relayed(chunk)
            await write_client(resp, chunk)

    @staticmethod
    def _headers(upstream, instance_id: str, extra: dict[str, str] | None = None) -> dict:
        headers = {INSTANCE_HEADER: instance_id, **(extra or {})}
        get = upstream.headers.get
        for name in RELAYED_HEADERS:
            value = get(name)
            if value is not None:
                headers[name] = value
        return headers
