"""Run an aiohttp app (engine or router) with uvloop when available and clean shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys

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


def run_app(app: web.Application, host: str, port: int) -> int:
    install_uvloop()
    try:
        web.run_app(app, host=host, port=port, handler_cancellation=True, print=None, access_log=None,
                    shutdown_timeout=5.0)
    except OSError as e:
        print(f"kvroute: cannot serve on {host}:{port}: {e}", file=sys.stderr)
        return 1
    return 0
