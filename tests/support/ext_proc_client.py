"""Envoy's side of an ext_proc stream, for tests: the messages Envoy sends (headers, body chunks,
trailers, the response's head and body) and a client that sends them to kvroute's endpoint picker
over real gRPC and reads what it answers."""

from __future__ import annotations

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format, struct_pb2

Mode = processing_mode_pb2.ProcessingMode


def _header_map(pairs) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])


def _metadata(namespaces: dict | None):
    if not namespaces:
        return None
    out = base_pb2.Metadata()
    for name, fields in namespaces.items():
        value = struct_pb2.Struct()
        value.update(fields)
        out.filter_metadata[name].CopyFrom(value)
    return out


def request_headers(path: str = "/v1/completions", headers: dict | None = None, end: bool = False,
                    body_mode=Mode.FULL_DUPLEX_STREAMED, response_mode=Mode.NONE,
                    metadata: dict | None = None, method: str = "POST") -> pb.ProcessingRequest:
    pairs = [(":method", method), (":path", path), (":authority", "kvroute"),
             ("content-type", "application/json"), *(headers or {}).items()]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_header_map(pairs), end_of_stream=end),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=body_mode, response_body_mode=response_mode),
        metadata_context=_metadata(metadata))


def request_body(chunk: bytes, end: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=end))


def request_trailers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers(trailers=_header_map([("x-done", "1")])))


def response_headers(status: int = 200, content_type: str = "text/event-stream", end: bool = False,
                     served: str | None = None) -> pb.ProcessingRequest:
    pairs = [(":status", str(status)), ("content-type", content_type)]
    metadata = {"envoy.lb": {"x-gateway-destination-endpoint-served": served}} if served else None
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_header_map(pairs), end_of_stream=end),
                                metadata_context=_metadata(metadata))


def response_body(chunk: bytes, end: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk, end_of_stream=end))


def destination_of(answer: pb.ProcessingResponse) -> tuple[str | None, str | None]:
    """(the x-gateway-destination-endpoint header, the same key in the envoy.lb metadata) of an answer."""
    which = answer.WhichOneof("response")
    common = getattr(answer, which).response
    header = next((h.header.raw_value.decode() for h in common.header_mutation.set_headers
                   if h.header.key == "x-gateway-destination-endpoint"), None)
    metadata = json_format.MessageToDict(answer.dynamic_metadata).get("envoy.lb", {})
    return header, metadata.get("x-gateway-destination-endpoint")


def echoed_body(answers) -> tuple[bytes, list[bool]]:
    """The body chunks streamed back in a list of answers, and each chunk's end_of_stream."""
    chunks = [a.request_body.response.body_mutation.streamed_response for a in answers if a.HasField("request_body")]
    return b"".join(c.body for c in chunks), [c.end_of_stream for c in chunks]


class ExtProcStream:
    """One ext_proc stream to the picker: `send` a message and read the answers it has for it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = pb_grpc.ExternalProcessorStub(channel).Process()

    async def send(self, message: pb.ProcessingRequest, answers: int) -> list[pb.ProcessingResponse]:
        await self.call.write(message)
        return [await self.call.read() for _ in range(answers)]

    async def end(self) -> list[pb.ProcessingResponse]:
        """Envoy is done with the request: the stream closes; whatever the picker still sent."""
        await self.call.done_writing()
        rest = []
        while (answer := await self.call.read()) is not grpc.aio.EOF:
            rest.append(answer)
        return rest
