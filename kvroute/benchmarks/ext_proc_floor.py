"""The floor under the endpoint picker's cost: an ext_proc server on grpcio's asyncio server that
does no routing at all.

    python -m kvroute.benchmarks.ext_proc_floor --port P --endpoint 127.0.0.1:E

Every request goes to one endpoint: the headers held until the body has come, then the headers
answer with x-gateway-destination-endpoint and the body echoed, and the response head answered;
the same messages, in the same order, that kvroute's picker (router/service/ext_proc/) sends, built
by its own router/service/ext_proc/messages.py, with no parsing, tokenizing, lookup or bookkeeping.
python -m kvroute.benchmarks.gateway measures it next to kvroute's picker behind the same Envoy, so the share of
the picker's CPU that is grpcio's is a measured figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvroute.router.contract.serve import install_uvloop
from kvroute.router.service.ext_proc import messages as msg


class FixedProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def Process(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        body = b""
        async for request in request_iterator:
            phase = request.WhichOneof("request")
            if phase == "request_body":
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    yield msg.destination([self.endpoint], "floor", "request_headers", len(body))
                    for answer in msg.echoed(body, end=True):
                        yield answer
            elif phase == "response_headers":
                yield msg.response_headers("floor")


async def serve(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(FixedProcessor(endpoint), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set("envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--endpoint", required=True, help="ip:port every request goes to")
    args = p.parse_args()
    install_uvloop()
    asyncio.run(serve(args.port, args.endpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
