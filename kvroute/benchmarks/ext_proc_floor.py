"""The floor under the endpoint picker's cost: an ext_proc server that does no routing at all, on
either of the picker's gRPC servers (--server lean, the default, or grpcio).

    python -m kvroute.benchmarks.ext_proc_floor --port P --endpoint 127.0.0.1:E [--server lean|grpcio]

Every request goes to one endpoint: the headers held until the body has come, then the headers
answer with x-gateway-destination-endpoint and the body echoed, and the response head answered;
the same messages, in the same order, that kvroute's picker (router/service/ext_proc/) sends, built
by its own router/service/ext_proc/messages.py and served by its own servers
(router/service/ext_proc/servers.py), with no parsing, tokenizing, lookup or bookkeeping.
python -m kvroute.benchmarks.gateway measures it next to kvroute's picker behind the same Envoy, so the
share of the picker's CPU that is the transport's is a measured figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from kvroute.router.contract.serve import install_uvloop
from kvroute.router.service.ext_proc import messages as msg
from kvroute.router.service.ext_proc.servers import SERVERS, make_server


class FixedExchange:
    """An Exchange's shape (`on`, `close`) sending every request to one endpoint."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.body = endpoint, b""

    async def on(self, request: msg.ProcessingRequest) -> list[msg.ProcessingResponse]:
        phase = request.WhichOneof("request")
        if phase == "request_body":
            self.body += request.request_body.body
            if request.request_body.end_of_stream:
                return [msg.destination([self.endpoint], "floor", "request_headers", len(self.body)),
                        *msg.echoed(self.body, end=True)]
        elif phase == "response_headers":
            return [msg.response_headers("floor")]
        return []

    def close(self) -> None:
        pass


async def serve(port: int, endpoint: str, server: str) -> None:
    picker = make_server(server, lambda: FixedExchange(endpoint), lambda: True, "127.0.0.1", port)  # type: ignore[arg-type, return-value]
    await picker.start()
    await asyncio.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--endpoint", required=True, help="ip:port every request goes to")
    p.add_argument("--server", choices=list(SERVERS), default="lean", help="the picker's gRPC server to measure")
    args = p.parse_args()
    install_uvloop()
    asyncio.run(serve(args.port, args.endpoint, args.server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
