"""Run an aiohttp app (engine or router) with uvloop when available and clean shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from typing import Callable

from aiohttp import web

log = logging.getLogger(__name__)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def config_values(config_class: type, args) -> dict:
    """The parsed CLI flags that are fields of `config_class` (flags map 1:1 onto fields)."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    return {k: v for k, v in vars(args).items() if k in fields}


def install_uvloop() -> bool:
    """Use uvloop unless KVROUTE_NO_UVLOOP=1 (kept for before/after measurements)."""
    if os.environ.get("KVROUTE_NO_UVLOOP") == "1":
        return False
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


SHUTDOWN = web.AppKey("shutdown", asyncio.Event)  # an app may set it to stop its server (a finished drain)


def run_app(app: web.Application, host: str, port: int, on_sigterm: Callable[[], None] | None = None) -> int:
    """Serve `app` until SIGINT, SIGTERM (or `on_sigterm`'s own ending) or app[SHUTDOWN] is set."""
    install_uvloop()
    try:
        return asyncio.run(_serve(app, host, port, on_sigterm))
    except KeyboardInterrupt:
        return 0


async def _serve(app: web.Application, host: str, port: int, on_sigterm: Callable[[], None] | None) -> int:
    if SHUTDOWN not in app:
        app[SHUTDOWN] = asyncio.Event()
    stop = app[SHUTDOWN]
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        print(f"kvroute: cannot serve on {host}:{port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm or stop.set)
    log.info("serving on http://%s:%d", host, port)
    await stop.wait()
    await runner.cleanup()
    return 0
