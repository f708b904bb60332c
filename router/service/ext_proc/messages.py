"""The ext_proc messages the endpoint picker sends Envoy (envoy.service.ext_proc.v3, from the
xds-protos wheel), and what it reads of Envoy's: headers, the body mode, metadata.

Names from the Endpoint Picker Protocol (gateway-api-inference-extension,
docs/proposals/004-endpoint-picker-protocol): the choice goes in the request header
`x-gateway-destination-endpoint` (`ip:port`, fallbacks after it, comma-separated) and under the
same key in the `envoy.lb` dynamic metadata namespace; the data plane's subset hint comes in the
filter metadata `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`, and the endpoint
that served a response in `envoy.lb` / `x-gateway-destination-endpoint-served`.
"""

from __future__ import annotations

import functools
import math
from typing import TypeAlias

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format
from multidict import CIMultiDict

from kvroute.router.contract.errors import KVRouteError, Overloaded
from kvroute.router.contract.http import status_of

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
INSTANCE_HEADER = "x-kvroute-instance"
BODY_CHUNK = 62000  # an echoed body in chunks under the 64 KiB some data planes allow per message

Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = Mode.FULL_DUPLEX_STREAMED
BUFFERED_MODES = (Mode.BUFFERED, Mode.BUFFERED_PARTIAL)
ProcessingRequest: TypeAlias = pb.ProcessingRequest
ProcessingResponse: TypeAlias = pb.ProcessingResponse


def headers_of(message) -> CIMultiDict:
    """An HttpHeaders or HttpTrailers message's headers (Envoy sends raw_value; older ones value)."""
    return CIMultiDict([(h.key, _value(h)) for h in message.headers.headers])


def _value(header) -> str:
    """A HeaderValue's value: raw_value (Envoy's, bytes) decoded leniently, else value (older Envoys)."""
    return header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value


def status_and_type(message) -> tuple[str, str]:
    """A response head's :status and content-type (all the picker reads of it; a repeated one: its
    first), without a header map: the walk stops once both came."""
    status = content_type = None
    for h in message.headers.headers:
        key = h.key
        if key == ":status" and status is None:
            status = _value(h)
            if content_type is not None:
                break
        elif key == "content-type" and content_type is None:
            content_type = _value(h)
            if status is not None:
                break
    return status or "", content_type or ""


def metadata_value(request, namespace: str, key: str):
    """A value of Envoy's filter metadata on this message (None when absent), as plain Python."""
    fields = request.metadata_context.filter_metadata  # empty when Envoy sent none
    if namespace not in fields or key not in fields[namespace].fields:
        return None
    return json_format.MessageToDict(fields[namespace].fields[key])


OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
PHASES = {"request_headers": pb.HeadersResponse, "response_headers": pb.HeadersResponse,
          "request_body": pb.BodyResponse, "response_body": pb.BodyResponse,
          "request_trailers": pb.TrailersResponse, "response_trailers": pb.TrailersResponse}


def _set_headers(mutation: pb.HeaderMutation, pairs) -> pb.HeaderMutation:
    """`pairs` set (overwriting) in `mutation`, built in place: the cheapest way with upb's protobuf."""
    for k, v in pairs:
        option = mutation.set_headers.add(append_action=OVERWRITE)
        option.header.key = k
        option.header.raw_value = v.encode()
    return mutation


def destination(endpoints: list[str], instance: str, phase: str, length: int | None = None,
                body: bytes | None = None) -> ProcessingResponse:
    """The choice, in the request header and the `envoy.lb` metadata alike, answering the request's
    headers (`phase` "request_headers") or its buffered body ("request_body"). `length`: the body's
    new Content-Length when the picker dropped fields of it; `body`: the new body (buffered modes)."""
    out = pb.ProcessingResponse()
    out.CopyFrom(_choice(",".join(endpoints), instance, phase))  # cheaper than building it (upb)
    if length is not None or body is not None:
        common = getattr(out, phase).response
        if length is not None:
            _set_headers(common.header_mutation, (("content-length", str(length)),))
        if body is not None:
            common.body_mutation.body = body
    return out


@functools.lru_cache(maxsize=4096)
def _choice(value: str, instance: str, phase: str) -> ProcessingResponse:
    """`destination` without a length or body: one message per choice, copied (never changed once built)."""
    out = pb.ProcessingResponse()
    common = getattr(out, phase).response
    _set_headers(common.header_mutation, ((DESTINATION, value), (INSTANCE_HEADER, instance)))
    common.clear_route_cache = True
    out.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    return out


@functools.cache
def carry_on(phase: str) -> ProcessingResponse:
    """Go on unchanged (`phase`: the message answered); one message per phase, sent as often as needed
    (never changed once built)."""
    return pb.ProcessingResponse(**{phase: PHASES[phase]()})


@functools.lru_cache(maxsize=4096)
def response_headers(instance: str) -> ProcessingResponse:
    """The answer's head goes on, naming the instance as the proxy does (`x-kvroute-instance`); one
    message per instance, sent as often as needed (never changed once built)."""
    out = pb.ProcessingResponse()
    _set_headers(out.response_headers.response.header_mutation, ((INSTANCE_HEADER, instance),))
    return out


def echoed(body: bytes, end: bool, phase: str = "request_body") -> list[ProcessingResponse]:
    """A body handed back in full-duplex mode, in streamed chunks; `end`: the last one ends the stream.
    Built in place (upb's protobuf: cheaper than nested constructors)."""
    out = []
    for i in range(0, max(1, len(body)), BODY_CHUNK):
        answer = pb.ProcessingResponse()
        streamed = getattr(answer, phase).response.body_mutation.streamed_response
        streamed.body = body[i:i + BODY_CHUNK]
        streamed.end_of_stream = end and i + BODY_CHUNK >= len(body)
        out.append(answer)
    return out


def refusal(error: KVRouteError, status: int | None = None,
            headers: tuple[tuple[str, str], ...] = ()) -> ProcessingResponse:
    """The answer Envoy sends the client at once: the proxy's status (or `status`), Retry-After and
    OpenAI error body."""
    pairs = list(headers)
    if isinstance(error, Overloaded):
        pairs.append(("retry-after", str(max(1, math.ceil(error.retry_after)))))
    details = f"kvroute_{error.code or 'error'}"
    return immediate(status or status_of(error), orjson.dumps(error.to_dict()), pairs, details)


def immediate(status: int, body: bytes, pairs: list[tuple[str, str]], details: str) -> ProcessingResponse:
    """An answer the client gets from Envoy at once (a JSON body), the engine nothing."""
    pairs = [("content-type", "application/json"), *pairs]
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=_set_headers(pb.HeaderMutation(), pairs),
        body=body, details=details))
