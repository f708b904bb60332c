"""The endpoint picker's gRPC servers by name (--ext-proc-server): "lean", the default (HTTP/2 on the
router's event loop, router/service/ext_proc/grpc_server.py), and "grpcio" (grpcio's asyncio server,
router/service/ext_proc/server.py), the fallback. Both serve the same Exchange and health rules;
each is imported only when chosen."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvroute.router.service.ext_proc.exchange import Exchange

SERVERS = {"lean": "kvroute.router.service.ext_proc.grpc_server:LeanServer",
           "grpcio": "kvroute.router.service.ext_proc.server:ExtProcServer"}


class PickerServer(Protocol):
    port: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def make_server(name: str, exchange: Callable[[], Exchange], ready: Callable[[], bool], host: str,
                port: int) -> PickerServer:
    module, cls = SERVERS[name].split(":")
    return getattr(importlib.import_module(module), cls)(exchange, ready, host, port)
