"""Run an aiohttp app (engine or router) with uvloop when available and clean shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from aiohttp import web

from kvroute.router.contract.connections import GuardedRunner
from kvroute.router.contract.interrupt import INTERRUPTED
from kvroute.router.contract.settings import check_settings, setting

log = logging.getLogger(__name__)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogConfig:
    """logging"""

    log_level: str = setting("INFO", "what the server logs, from the most to the least", choices=LOG_LEVELS,
                             parse=str.upper)

    def __post_init__(self) -> None:
        check_settings(self)


def setup_logging(level: str) -> None:
    LogConfig(log_level=level.upper())  # one of LOG_LEVELS, else ValueError
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port now, before any slow startup; OSError says why not."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "the port is in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise OSError(f"cannot listen on {host}:{port}: {why}") from None
    return sock


GC_YOUNG_THRESHOLD = 10_000  # allocations between collections of the youngest generation (CPython's: 700)


def settle_gc(young: int = GC_YOUNG_THRESHOLD) -> None:
    """Once a server is up: everything built so far (tokenizer, tables, the app) lives as long as the
    process, so it is frozen out of every later collection (`gc.freeze`), and young objects are
    collected every `young` allocations, not 700. The request paths make no reference cycles
    (tests/process/test_no_cycles.py): their objects are freed by reference counting, and a
    collection only walks what is alive."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


SHUTDOWN = web.AppKey("shutdown", asyncio.Event)  # an app may set it to stop its server (a finished drain)


def run_app(app: web.Application, sock: socket.socket, name: str,
            on_sigterm: Callable[[], None] | None = None) -> int:
    """Serve `app` on a socket from `bind_socket` until SIGINT, SIGTERM (or what `on_sigterm`
    does instead: a drain, which ends by setting app[SHUTDOWN]) or app[SHUTDOWN] is set.
    Logs "<name> listening on URL" once it is up. The exit status: 0, or 130 when SIGINT (Ctrl-C) stopped
    it (interrupt.py)."""
    install_uvloop()
    try:
        return asyncio.run(_serve(app, sock, name, on_sigterm))
    except KeyboardInterrupt:  # before the loop took SIGINT over
        return INTERRUPTED


CLEANUP_S = 10.0  # what stopping may take once requests are done (a drain of 30 s + this fits a 45 s grace period)


async def _cleanup(runner: web.AppRunner, what: str) -> bool:
    """What the app started stopped (an engine's step loop, its threads, the router's feeds and
    clients), whether its startup finished or was cut short; at most CLEANUP_S, so a part that
    hangs in its own cleanup does not hold the exit. False when it was given up on or failed."""
    try:
        async with asyncio.timeout(CLEANUP_S):
            await runner.cleanup()
        return True
    except TimeoutError:
        log.warning("cleanup %s took over %.0f s; exiting without it", what, CLEANUP_S)
    except Exception as e:  # a partial startup may not clean up whole; the process is ending anyway
        log.warning("cleanup %s: %s", what, e)
    return False


async def _serve(app: web.Application, sock: socket.socket, name: str, on_sigterm: Callable[[], None] | None) -> int:
    if SHUTDOWN not in app:
        app[SHUTDOWN] = asyncio.Event()
    stop = app[SHUTDOWN]
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    runner = GuardedRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    try:
        await runner.setup()
    except BaseException:  # Ctrl-C (the task cancelled) or a failure part way: stop what started
        await _cleanup(runner, "after an interrupted startup")
        raise
    try:
        await web.SockSite(runner, sock).start()
    except OSError as e:
        print(f"kvroute: cannot serve on {url}: {e}", file=sys.stderr)
        await _cleanup(runner, "after a failed start")
        return 1
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()

    def on_sigint() -> None:
        interrupted.set()
        stop.set()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm or stop.set)
    log.info("%s listening on %s", name, url)
    settle_gc()
    await stop.wait()
    if interrupted.is_set():
        log.info("%s interrupted (SIGINT); stopping", name)
    clean = await _cleanup(runner, f"of {name}")
    return INTERRUPTED if interrupted.is_set() else 0 if clean else 1
