"""The lean server's gRPC methods: Envoy's ExternalProcessor/Process over the picker's `Exchange`
(router/service/ext_proc/exchange.py, the same as on grpcio's server), and grpc.health.v1.Health's
Check and Watch over the HealthBook. Each is a handler of one call (grpc_stream.py's Stream)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from kvroute.router.service.ext_proc import messages as msg
from kvroute.router.service.ext_proc.exchange import Exchange
from kvroute.router.service.ext_proc.grpc_stream import INVALID_ARGUMENT, NOT_FOUND, Stream
from kvroute.router.service.ext_proc.health_book import SERVICE, SERVICE_UNKNOWN, HealthBook

Handler = Callable[[Stream], Awaitable[None]]


def methods(exchange: Callable[[], Exchange], book: HealthBook) -> dict[bytes, Handler]:
    """The handlers by the :path their calls come on."""

    async def process(stream: Stream) -> None:
        ex = exchange()
        try:
            while (data := await stream.receive()) is not None:
                try:
                    request = msg.ProcessingRequest.FromString(data)
                except DecodeError:
                    return stream.finish(INVALID_ARGUMENT, "a ProcessingRequest that does not parse")
                for answer in await ex.on(request):
                    await stream.send(answer.SerializeToString())
        finally:
            ex.close()

    async def check(stream: Stream) -> None:
        service = await _health_request(stream)
        if service is None:
            return
        status = book.statuses.get(service)
        if status is None:
            return stream.finish(NOT_FOUND, "unknown service")
        await stream.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    async def watch(stream: Stream) -> None:
        service = await _health_request(stream)
        last = None
        while service is not None:
            status = book.statuses.get(service, SERVICE_UNKNOWN)
            if status != last:
                await stream.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                last = status
            if book.stopped:  # NOT_SERVING told: the call ends, the server does not wait for it
                return
            await book.changed()

    return {f"/{SERVICE}/Process".encode(): process, b"/grpc.health.v1.Health/Check": check,
            b"/grpc.health.v1.Health/Watch": watch}


async def _health_request(stream: Stream) -> str | None:
    data = await stream.receive()
    try:
        return health_pb2.HealthCheckRequest.FromString(data or b"").service
    except DecodeError:
        stream.finish(INVALID_ARGUMENT, "a HealthCheckRequest that does not parse")
        return None
