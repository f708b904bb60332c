"""One HTTP request as its ext_proc stream shows it: Envoy's messages in, the picker's answers out.

    request headers   held (full duplex) or answered at once (buffered modes; a request without body)
    request body      chunks gathered (a duplicate end of stream is ignored); at its end the request is
                      picked (router/service/picker.py) and the answers go out in order: the headers
                      response carrying the choice (`x-gateway-destination-endpoint` and the `envoy.lb`
                      metadata), then the body echoed as streamed chunks (full duplex), or the choice
                      on the body's answer (buffered); a refusal is an immediate response instead
    request trailers  end a body that did not end itself: picked there, the trailers go on after it
    response headers  the status, the endpoint that served (a fallback moves the charge there); with
                      no response body to come, the first byte
    response body     the first byte, the stream's SSE events and usage (or a whole answer's body)
    response trailers, or the body's end: the finish
    the stream's end  whatever the request still charges is released (a client gone: cancelled)

Every request passes what the proxy applies to its path before anything else: with API keys, the key
(401); a path the proxy sends no engine is answered here (router/service/ext_proc/own_routes.py: the
models, else 404); a completion path takes POST only (405), a Content-Length within --max-body-bytes
(413) and a body (400). A completion Envoy does not let the picker read first (request body mode NONE
or STREAMED: the headers must go before the body) is refused (500, the gateway's configuration):
the proxy's checks need the body.
"""

from __future__ import annotations

import logging

from multidict import CIMultiDict

from kvroute.router.contract.errors import KVRouteError, PayloadTooLarge, Unauthorized, Unavailable
from kvroute.router.contract.http import parse_json, status_of
from kvroute.router.service.endpoints import split_endpoints
from kvroute.router.service.entry import ROUTED
from kvroute.router.service.ext_proc import messages as msg
from kvroute.router.service.ext_proc.own_routes import answer, not_allowed
from kvroute.router.service.picker import Picked, Picker
from kvroute.router.service.steering import forwardable
from kvroute.router.service.tenant_book import TenantBook

log = logging.getLogger(__name__)

UNREAD_MODES = (msg.Mode.NONE, msg.Mode.STREAMED)  # Envoy sends the body after the headers' answer, if at all
WHOLE_BODY_CAP = 1 << 20  # a whole answer's bytes kept for its usage; past it, none is read


class Exchange:
    __slots__ = ("picker", "book", "max_body", "headers", "body", "request_mode", "response_mode", "among",
                 "picked", "answered", "status", "stream", "first_seen", "whole", "ended", "kind", "key_tenant", "size")

    def __init__(self, picker: Picker, book: TenantBook, max_body: int) -> None:
        self.picker, self.book, self.max_body = picker, book, max_body
        self.headers: CIMultiDict = CIMultiDict()  # the request's, once they came
        self.body: list[bytes] = []  # the request body's chunks (most bodies come in one: not copied)
        self.size = 0
        self.request_mode = msg.FULL_DUPLEX  # until Envoy's protocol_config says otherwise
        self.response_mode = msg.Mode.NONE
        self.among: list[str] | None = None  # the data plane's subset hint: the endpoints allowed
        self.picked: Picked | None = None
        self.answered = False  # the request's phase is answered: its destination (or a refusal) went out
        self.status = ""  # the response's
        self.stream = False
        self.first_seen = False
        self.whole: bytearray | None = None
        self.ended = False
        self.kind = ""  # completion or chat, once the headers came
        self.key_tenant: str | None = None  # the tenant of the request's API key (with keys)

    async def on(self, request: msg.ProcessingRequest) -> list[msg.ProcessingResponse]:
        """The answers to one of Envoy's messages, in order (none while the body is held)."""
        if request.HasField("protocol_config"):
            self.request_mode = request.protocol_config.request_body_mode
            self.response_mode = request.protocol_config.response_body_mode
        among = msg.metadata_value(request, msg.SUBSET_NAMESPACE, msg.SUBSET_KEY)
        if among is not None:
            self.among = split_endpoints(among)
        phase = request.WhichOneof("request")
        try:
            return await getattr(self, phase)(request)
        except KVRouteError as e:
            return self._refuse(e)

    async def request_headers(self, request) -> list[msg.ProcessingResponse]:
        self.headers = msg.headers_of(request.request_headers)
        self.key_tenant = self._tenant_by_key()  # every request, before anything else
        path = self.headers.get(":path", "").split("?", 1)[0]
        method = self.headers.get(":method", "")
        self.answered = True  # unless the request goes on to be picked below
        kind = ROUTED.get(path)
        if kind is None:
            return [answer(method, path, self.picker)]
        if method != "POST":
            return [not_allowed("POST")]
        if self.request_mode in UNREAD_MODES:
            raise KVRouteError("the gateway sends kvroute no request body before the headers' answer (ext_proc "
                               "request_body_mode NONE or STREAMED): give it FULL_DUPLEX_STREAMED or BUFFERED",
                               code="ext_proc_body_mode")
        length = self.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise PayloadTooLarge(f"request body is over {self.max_body} bytes (--max-body-bytes)")
        self.kind, self.answered = kind, False
        if request.request_headers.end_of_stream:
            return await self._picked(trailers=False)  # no body: refused as the proxy refuses one (400)
        if self.request_mode in msg.BUFFERED_MODES:
            return [msg.carry_on("request_headers")]
        return []  # full duplex: held until the body has come

    async def request_body(self, request) -> list[msg.ProcessingResponse]:
        part = request.request_body
        if self.answered:  # a duplicate end of stream, or bytes after the decision: nothing to answer
            return []
        if self.size + len(part.body) > self.max_body:
            raise PayloadTooLarge(f"request body is over {self.max_body} bytes (--max-body-bytes)")
        if part.body:
            self.body.append(part.body)
            self.size += len(part.body)
        if self.request_mode == msg.Mode.BUFFERED_PARTIAL and not part.end_of_stream:
            raise PayloadTooLarge("request body is over what the gateway buffers (BUFFERED_PARTIAL): give the "
                                  "ext_proc filter FULL_DUPLEX_STREAMED or a larger buffer")
        if not part.end_of_stream:
            return []
        return await self._picked(trailers=False)

    async def request_trailers(self, request) -> list[msg.ProcessingResponse]:
        out = [] if self.answered else await self._picked(trailers=True)
        if out and out[-1].HasField("immediate_response"):
            return out
        return out + [msg.carry_on("request_trailers")]

    async def response_headers(self, request) -> list[msg.ProcessingResponse]:
        status, content_type = msg.status_and_type(request.response_headers)
        self.status = status
        picked = self.picked
        if picked is None:
            return [msg.carry_on("response_headers")]
        served = msg.metadata_value(request, msg.LB_NAMESPACE, msg.SERVED)
        if isinstance(served, str):
            self.picker.served_by(picked, served)
        self.stream = "text/event-stream" in content_type
        if request.response_headers.end_of_stream or self.response_mode == msg.Mode.NONE:
            self._first_byte()  # no body will show it: the head is the first byte
        if request.response_headers.end_of_stream:
            self._finish(self.status)
        return [msg.response_headers(picked.instance.id)]

    async def response_body(self, request) -> list[msg.ProcessingResponse]:
        part = request.response_body
        if self.picked is not None and not self.ended:
            if part.body:
                self._first_byte()
                self._read(part.body)
            if part.end_of_stream:
                self._finish(self.status or "200")
        if self.response_mode == msg.FULL_DUPLEX:
            return msg.echoed(part.body, part.end_of_stream, "response_body")
        return [msg.carry_on("response_body")]

    async def response_trailers(self, request) -> list[msg.ProcessingResponse]:
        self._finish(self.status or "200")
        return [msg.carry_on("response_trailers")]

    def close(self) -> None:
        """The stream ended: a request still charged ends with its response's status if one came
        (a data plane that sends no body or trailers), else as cancelled (the client left)."""
        self._finish(self.status or "cancelled")

    # -- the request's phase ---------------------------------------------------------------------

    async def _picked(self, trailers: bool) -> list[msg.ProcessingResponse]:
        """Pick from the whole body; the answers in the order the request's mode needs."""
        phase = "request_headers" if self.request_mode == msg.FULL_DUPLEX else "request_body"
        original = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        body, raw = forwardable(parse_json(original), original)
        self.picked = picked = await self.picker.pick(body, self.kind, self.headers, self.key_tenant, self.among, raw)
        raw = picked.flight.raw  # the priority within the tenant's: the bytes the engine gets
        self.answered = True
        fallbacks = picked.fallbacks[: self.picker.cluster.config.ext_proc_fallbacks]
        endpoints = [self.picker.endpoint(i) for i in (picked.instance, *fallbacks)]
        if self.request_mode == msg.FULL_DUPLEX:  # the body goes on as echoed here: its length with it
            return [msg.destination(endpoints, picked.instance.id, phase, len(raw)), *msg.echoed(raw, end=not trailers)]
        changed = raw is not original  # engine-only fields were dropped: the body replaced, a new length
        return [msg.destination(endpoints, picked.instance.id, phase, len(raw) if changed else None,
                                body=raw if changed else None)]

    def _tenant_by_key(self) -> str | None:
        """The tenant of the request's API key, as the proxy's auth middleware finds it; none without keys."""
        if not self.book.has_keys:
            return None
        tenant = self.book.tenant_of_key(self.headers.get("authorization", ""))
        if tenant is None:
            raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
        return tenant

    def _refuse(self, error: KVRouteError) -> list[msg.ProcessingResponse]:
        """An immediate response ends the exchange: the client gets the error, the engine nothing."""
        if status_of(error) >= 500 and not isinstance(error, Unavailable | PayloadTooLarge):
            log.warning("ext_proc refused a request: %s", error.message)
        self.answered = True
        self._finish(str(status_of(error)))
        return [msg.refusal(error)]

    # -- the response's phase --------------------------------------------------------------------

    def _first_byte(self) -> None:
        if not self.first_seen and self.picked is not None and self.status == "200":
            self.first_seen = True
            self.picked.first_token(is_ttft=self.stream)

    def _read(self, chunk: bytes) -> None:
        """What the relay reads of the answer: a stream's events and usage, or a whole body's usage."""
        if self.stream and self.picked is not None:
            self.picked.flight.relayed(chunk)
            return
        if self.whole is None:
            self.whole = bytearray()
        if len(self.whole) + len(chunk) <= WHOLE_BODY_CAP:
            self.whole += chunk

    def _finish(self, status: str) -> None:
        if self.ended or self.picked is None:
            self.ended = True
            return
        self.ended = True
        flight = self.picked.flight
        flight.answered(self.picked.instance.id, bytes(self.whole) if self.whole is not None else None)
        flight.finish(status)
