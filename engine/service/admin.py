"""The engine's admin API, behind its `--admin-key` (off without one):

    POST /admin/drain                   start draining (engine/service/drain.py); 202
    POST /admin/role {"role": "prefill" | "decode" | "both"}
                                        switch roles without a restart: the prefix cache
                                        stays, running requests finish under the role they
                                        started with, new ones follow the new role; the change
                                        is announced in the registry, /kv/info and /load
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from kvroute.engine.service.app_keys import CONFIG, DRAIN, ENGINE, REGISTRATION
from kvroute.router.contract.errors import BadRequest, Forbidden, Unauthorized
from kvroute.router.contract.http import json_response, read_json
from kvroute.router.contract.protocol import ROLES

log = logging.getLogger(__name__)


def check_admin(request: web.Request, key: str | None) -> None:
    if not key:
        raise Forbidden("this engine has no --admin-key, so its admin API is off", code="admin_disabled")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise Unauthorized("missing or invalid admin key (Authorization: Bearer <key>)")


async def handle_drain(request: web.Request) -> web.Response:
    check_admin(request, request.app[CONFIG].server.admin_key)
    request.app[DRAIN].start("POST /admin/drain")
    return json_response({"status": "draining", "running": len(request.app[ENGINE].requests)}, status=202)


async def handle_role(request: web.Request) -> web.Response:
    check_admin(request, request.app[CONFIG].server.admin_key)
    body = await read_json(request)
    role = body.get("role")
    if role not in ROLES:
        raise BadRequest(f"'role' must be one of {', '.join(ROLES)}, got {role!r}", param="role")
    engine = request.app[ENGINE]
    previous, engine.role = engine.role, role
    if role != previous:
        log.warning("role changed %s -> %s (%d requests running keep their role)", previous, role,
                    len(engine.requests))
        registration = request.app.get(REGISTRATION)
        if registration is not None:
            await registration.changed("role")
    return json_response({"role": role, "previous": previous})
