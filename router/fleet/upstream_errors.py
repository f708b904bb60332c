"""A short reason for a failed contact with an engine, instead of an exception's repr.

    connection refused | DNS lookup failed for HOST | timed out | the engine closed the connection |
    not a kvroute engine: GET /kv/info answered HTTP 404 | incompatible: malformed /kv/info: ...

`NotAnEngine` and `Incompatible` are what the cluster raises for a server that answers but
is not (or not a usable) kvroute engine, `BadAnswer` for an engine's error status on /health or
/load (a draining engine, say); `describe_failure` maps those and aiohttp's errors onto one line.
"""

from __future__ import annotations

import asyncio
import errno

import aiohttp


class BadAnswer(ValueError):
    """An engine answered a health or load request with an error status or a body that is not JSON."""


class NotAnEngine(BadAnswer):
    """The server answered GET /kv/info, but not as a kvroute engine (wrong status, not JSON)."""


class Incompatible(ValueError):
    """A kvroute engine the router cannot use (its /kv/info lacks or mistypes a field)."""


class LookupFailed(aiohttp.ClientOSError):
    """A host name that does not resolve, from the router's lean client (router/service/upstream.py);
    aiohttp's own client raises ClientConnectorDNSError."""

    def __init__(self, host: str, error: OSError) -> None:
        super().__init__(error.errno or 0, error.strerror or str(error))
        self.host = host


def _os_reason(e: OSError | None) -> str:
    if e is None:
        return "connection failed"
    if isinstance(e, ConnectionRefusedError) or e.errno == errno.ECONNREFUSED:
        return "connection refused"
    if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "host unreachable"
    return (e.strerror or type(e).__name__).lower()


def describe_failure(e: BaseException) -> str:
    if isinstance(e, NotAnEngine):
        return f"not a kvroute engine: {e}"
    if isinstance(e, Incompatible):
        return f"incompatible: {e}"
    if isinstance(e, BadAnswer):
        return str(e)
    if isinstance(e, (aiohttp.ClientConnectorDNSError, LookupFailed)):
        return f"DNS lookup failed for {e.host}"
    if isinstance(e, aiohttp.ClientConnectorError):
        return _os_reason(e.os_error)
    if isinstance(e, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "timed out"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the engine closed the connection"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "the engine's answer broke off"
    if isinstance(e, aiohttp.ClientResponseError):
        return f"HTTP {e.status}"
    if isinstance(e, aiohttp.ClientOSError):
        return _os_reason(e)
    text = str(e).splitlines()[0][:160] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
