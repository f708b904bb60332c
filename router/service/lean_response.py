"""A whole answer of the lean front (router/service/lean_server.py) in one buffer, as aiohttp's
writer would send it."""

from __future__ import annotations

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE


def whole_response(resp: web.StreamResponse, keep_alive: bool) -> bytes | None:
    """A plain `web.Response` with a bytes body, as aiohttp writes it to an HTTP/1.1 client (status
    line, its headers, Content-Length, Date, Server, `Connection: close` when not kept alive), in
    one buffer; None for anything else (a stream, a payload, cookies, compression), which aiohttp's
    own classes write."""
    # `resp.cookies` would make an empty cookie jar per answer (aiohttp makes it on first read)
    if type(resp) is not web.Response or resp.prepared or getattr(resp, "_cookies", None) or resp.compression:
        return None
    body = resp.body
    if not isinstance(body, bytes) or resp.keep_alive is False:
        return None
    lines = [f"HTTP/1.1 {resp.status} {resp.reason}"]
    seen = set()
    for name, value in resp.headers.items():
        if "\n" in value or "\r" in value:
            return None  # a header value with a line break: aiohttp's writer refuses it
        lower = name.lower()
        seen.add(lower)
        if lower != "content-length":
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    if body and "content-type" not in seen:
        lines.append("Content-Type: application/octet-stream")
    if "date" not in seen:
        lines.append(f"Date: {rfc822_formatted_time()}")
    if "server" not in seen:
        lines.append(f"Server: {SERVER_SOFTWARE}")
    if not keep_alive:
        lines.append("Connection: close")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8") + body
