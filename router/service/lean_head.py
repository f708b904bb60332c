"""Which request heads the lean front (router/service/lean_server.py) serves itself: an HTTP/1.1
POST to one of its paths, parsed by httptools (llhttp), with a Host, at most MAX_HEADERS headers,
none named twice, CRLF line ends, and none of REFUSED_HEADERS. Anything else is aiohttp's to answer,
with the connection, so both fronts answer alike (tests/unit/test_front_parity.py)."""

from __future__ import annotations

from typing import NamedTuple

from kvroute.router.contract.connections import MAX_HEADERS
from kvroute.router.service.upstream import Headers

try:
    import httptools
except ImportError:  # pragma: no cover - httptools is a dependency; aiohttp serves without it
    httptools = None  # type: ignore[assignment]  # the module or None: lean_server.available() checks

MAX_HEAD = 8190  # aiohttp's line limit: a longer head is aiohttp's to judge
REFUSED_HEADERS = ("transfer-encoding", "expect", "upgrade")


class ServedHead(NamedTuple):
    path: str
    headers: Headers
    length: int | None  # Content-Length
    keep_alive: bool


class _Head:
    """httptools' callbacks for one request head: the URL, the headers (names lower-cased, values
    without the trailing whitespace llhttp leaves, as aiohttp strips it), how many, and whether a
    name came twice."""

    __slots__ = ("url", "headers", "count", "repeated")

    def __init__(self) -> None:
        self.url = b""
        self.headers = Headers()
        self.count = 0
        self.repeated = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        text = value.rstrip(b" \t").decode("latin-1")
        if dict.setdefault(self.headers, name.decode("latin-1").lower(), text) is not text:
            self.repeated = True


def bare_lf(before: bytes, data: bytes) -> bool:
    """Whether `data`, following the byte `before` (b"" at the start), has a line feed not preceded by
    a carriage return."""
    return data.count(b"\n") != (before + data).count(b"\r\n")


def parse_head(head: bytes, paths) -> ServedHead | None:
    """The head (through its blank line) if the lean front serves it, for one of `paths`; else None."""
    if bare_lf(b"", head):
        return None
    callbacks = _Head()
    parser = httptools.HttpRequestParser(callbacks)
    try:
        parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    path = callbacks.url.decode("latin-1")
    headers = callbacks.headers
    if (path not in paths or parser.get_method() != b"POST" or parser.get_http_version() != "1.1"
            or callbacks.repeated or callbacks.count > MAX_HEADERS or "host" not in headers
            or not headers.keys().isdisjoint(REFUSED_HEADERS)):
        return None
    length = dict.get(headers, "content-length")  # names are lower-cased already
    return ServedHead(path, headers, int(length) if length is not None else None, parser.should_keep_alive())
