"""The tenant file at run time: GET /admin/tenants, POST /admin/tenants/reload, and SIGHUP.

Both routes sit behind the admin key, like the fleet admin API (router/service/admin.py). A
reload that fails (the file is gone or does not parse) keeps the tenants as they were and
says why (400; on SIGHUP, a log line). With --workers, the supervisor passes SIGHUP on to
every worker; the admin route reloads the worker that answers it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from kvroute.router.contract.errors import BadRequest, Forbidden
from kvroute.router.contract.http import add_body_route, json_response
from kvroute.router.service.app_keys import CONFIG, GATE, TENANTS
from kvroute.router.service.tenant_book import TenantBook

log = logging.getLogger(__name__)


def _rows(book: TenantBook) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(spec).items() if k != "keys"} for spec in book.tenants.values()]


def _book(request: web.Request) -> TenantBook:
    if not request.app[CONFIG].admin_key:
        raise Forbidden("the tenant admin API needs the router started with --admin-key", code="admin_disabled")
    return request.app[TENANTS]


async def handle_list(request: web.Request) -> web.Response:
    book = _book(request)
    gate = request.app.get(GATE)
    depth = {f"{t}/{b}": n for (t, b), n in gate.queue.depth().items()} if gate is not None else {}
    return json_response({"tenants": _rows(book), "file": str(book.path) if book.path else None,
                          "header": book.header, "queued": depth})


async def handle_reload(request: web.Request) -> web.Response:
    book = _book(request)
    if book.path is None:
        raise BadRequest("this router has no tenant file (--tenants FILE) to reload", code="no_tenant_file")
    try:
        book.reload()
    except (ValueError, OSError) as e:
        raise BadRequest(f"tenant file {book.path} not reloaded, the tenants are unchanged: {e}",
                         code="bad_tenant_file") from None
    log.info("tenant file %s reloaded: %d tenants", book.path, len(book.tenants))
    return json_response({"reloaded": True, "tenants": _rows(book)})


def reload_on_signal(book: TenantBook) -> Callable[[], object]:
    """Reload `book` on SIGHUP (where the loop can take signals); returns the undo."""
    def reload() -> None:
        try:
            book.reload()
            log.info("SIGHUP: tenant file %s reloaded: %d tenants", book.path, len(book.tenants))
        except (ValueError, OSError) as e:
            log.warning("SIGHUP: tenant file %s not reloaded, the tenants are unchanged: %s", book.path, e)

    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, reload)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals here
        return lambda: None
    return lambda: loop.remove_signal_handler(signal.SIGHUP)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/tenants", handle_list)
    add_body_route(app, "/admin/tenants/reload", handle_reload)
