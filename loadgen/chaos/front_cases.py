"""Hostile and odd request bytes, each with the one answer the router's HTTP server must give (aiohttp's,
under the connection rules of router/contract/connections.py): the statuses in order (interim
`100 Continue` included) and what becomes of the connection after the last one.

    open     kept alive (no close within the settle time)
    closed   closed right after the answer (a 400 for a malformed head; an answer sent before the
             whole body was read closes after the lingering of router/contract/connections.py)
    idle     closed by the idle timeout after the answer, not before and not never

Findings of the third hostile round (issue 36): 4 (a stalled body), 5 (upgrades and CONNECT,
alone and pipelined after a normal request), 11 (Host, header count, bare LF, trailing space in
Authorization, `Expect: 100-continue` with a 50 MB body); plus the framing cases of request
smuggling and the plain ones. The router under test runs with `--api-key KEY`; tests
(tests/unit/test_front_cases.py) and the `front-cases` chaos scenario send every case.
"""

from __future__ import annotations

import dataclasses

from kvroute.loadgen.chaos.httpraw import exchange
from kvroute.router.contract.connections import LINGER_S

KEY = "front-case-key"
BODY = b'{"prompt": "hello there", "max_tokens": 2}'
MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class FrontCase:
    name: str
    finding: str  # "4", "5", "11" (issue 36), "framing", "plain"
    data: bytes
    statuses: tuple[int, ...]
    after: str  # "open", "closed", "idle"
    slow: bool = False  # answered only at a timeout (body or header): give it that long


def post(*, extra: bytes = b"", host: bytes = b"Host: x\r\n", body: bytes = BODY, path: bytes = b"/v1/completions",
         auth: bytes = b"Authorization: Bearer " + KEY.encode() + b"\r\n", eol: bytes = b"\r\n",
         length: int | None = None, version: bytes = b"HTTP/1.1", method: bytes = b"POST") -> bytes:
    declared = len(body) if length is None else length
    lines = [method + b" " + path + b" " + version, *_lines(host + auth), b"Content-Type: application/json",
             b"Content-Length: %d" % declared, *_lines(extra)]
    return eol.join(lines) + eol + eol + body


def _lines(block: bytes) -> list[bytes]:
    return [line for line in block.split(b"\r\n") if line]


def _headers(n: int) -> bytes:
    return b"".join(b"X-Filler-%d: v\r\n" % i for i in range(n))


H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
WEBSOCKET = (b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
             b"Sec-WebSocket-Version: 13\r\n")
CONNECT = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
CHUNKED = b"Transfer-Encoding: chunked\r\n"
# a POST with every standard header but the framing ones: 4 lines, the rest filler up to a count
BASE_HEADERS = 4


def _chunked(body: bytes, extra: bytes = b"") -> bytes:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\n" + CHUNKED + extra + b"\r\n")
    return head + body


CASES = (
    FrontCase("normal", "plain", post(), (200,), "open"),
    FrontCase("chunked-body", "plain", _chunked(b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)), (200,), "open"),
    FrontCase("http-1.0", "plain", post(version=b"HTTP/1.0"), (200,), "closed"),
    FrontCase("absolute-form", "plain", post(path=b"http://x/v1/completions"), (200,), "open"),
    FrontCase("wrong-key", "plain", post(auth=b"Authorization: Bearer nope\r\n"), (401,), "open"),
    # finding 11
    FrontCase("no-host", "11", post(host=b""), (400,), "closed"),
    FrontCase("duplicate-host", "11", post(host=b"Host: x\r\nHost: y\r\n"), (400,), "closed"),
    FrontCase("headers-at-limit", "11", post(extra=_headers(128 - BASE_HEADERS)), (200,), "open"),
    FrontCase("headers-past-limit", "11", post(extra=_headers(129 - BASE_HEADERS)), (400,), "closed"),
    FrontCase("200-headers", "11", post(extra=_headers(200)), (400,), "closed"),
    FrontCase("bare-lf", "11", post(eol=b"\n"), (400,), "closed"),
    FrontCase("bare-lf-one-line", "11", post(extra=b"X-A: 1\n"), (400,), "closed"),
    FrontCase("bare-cr", "11", post(extra=b"X-A: 1\rX-B: 2\r\n"), (400,), "closed"),
    FrontCase("authorization-trailing-space", "11", post(auth=b"Authorization: Bearer " + KEY.encode() + b" \r\n"),
              (200,), "open"),
    FrontCase("expect-50MB", "11", post(extra=b"Expect: 100-continue\r\n", body=b"", length=50 * MB), (413,), "closed"),
    FrontCase("expect-small", "11", post(extra=b"Expect: 100-continue\r\n"), (100, 200), "open"),
    FrontCase("declared-50MB", "11", post(body=b"{", length=50 * MB), (413,), "closed"),
    # finding 5
    FrontCase("h2c-upgrade", "5", post(extra=H2C), (200,), "open"),
    FrontCase("websocket-upgrade", "5", post(extra=WEBSOCKET), (200,), "open"),
    FrontCase("upgrade-header-alone", "5", post(extra=b"Upgrade: h2c\r\n"), (200,), "open"),
    FrontCase("get-h2c", "5", post(method=b"GET", body=b"", extra=H2C), (405,), "open"),
    FrontCase("connect", "5", CONNECT, (404,), "open"),
    FrontCase("pipelined-h2c", "5", post() + post(extra=H2C), (200, 200), "idle"),
    FrontCase("pipelined-connect", "5", post() + CONNECT, (200, 404), "idle"),
    # finding 4
    FrontCase("stalled-body", "4", post(body=b'{"prompt": "hel', length=1000), (408,), "closed", slow=True),
    FrontCase("stalled-chunked-body", "4", _chunked(b"5\r\n{\"pro"), (408,), "closed", slow=True),
    FrontCase("stalled-head", "4", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", (), "closed", slow=True),
    # request framing (smuggling)
    FrontCase("content-length-and-chunked", "framing", post(extra=CHUNKED), (400,), "closed"),
    FrontCase("content-length-twice", "framing", post(extra=b"Content-Length: %d\r\n" % len(BODY)), (400,), "closed"),
    FrontCase("content-length-plus", "framing", post().replace(b"Content-Length: ", b"Content-Length: +"), (400,),
              "closed"),
    FrontCase("content-length-negative", "framing", post(body=b"", length=-1), (400,), "closed"),
    FrontCase("chunk-size-garbage", "framing", _chunked(b"zz\r\n" + BODY), (400,), "closed"),
    FrontCase("chunked-then-identity", "framing", _chunked(b"0\r\n\r\n").replace(b"chunked", b"chunked, identity"),
              (400,), "closed"),
    FrontCase("obs-fold", "framing", post(extra=b"X-A: 1\r\n folded\r\n"), (400,), "closed"),
    FrontCase("nul-in-header", "framing", post(extra=b"X-A: a\x00b\r\n"), (400,), "closed"),
    FrontCase("space-before-colon", "framing", post(extra=b"X-A : 1\r\n"), (400,), "closed"),
    FrontCase("lower-case-method", "framing", post(method=b"post"), (400,), "closed"),
)

FOLLOW = post()  # sent after a case's answers: a kept-alive connection answers it


async def observe(host: str, port: int, case: FrontCase, idle_s: float,
                  timeout_s: float = 10.0) -> tuple[tuple[int, ...], str]:
    """What a front did with `case`: its statuses, and "open" (a follow-up request was answered 200),
    "closed" (closed with no answer to the follow-up, or before `idle_s` / 2 for an idle case),
    "idle" (closed after `idle_s` / 2), "never closed", or what went wrong."""
    finals = sum(s >= 200 for s in case.statuses)
    idle = case.after == "idle"
    follow = FOLLOW if finals and not idle else b""
    ex = await exchange(host, port, case.data, finals, follow=follow, timeout_s=timeout_s,
                        wait_s=idle_s + 2.0 if idle else LINGER_S + 1.5)
    statuses = ex.statuses
    if ex.error is not None:
        return statuses, ex.error
    if ex.follow_status is not None:
        return statuses, "open" if ex.follow_status == 200 else f"follow-up answered {ex.follow_status}"
    if ex.closed_after_s is None:
        return statuses, "never closed"
    return statuses, "idle" if idle and ex.closed_after_s >= idle_s / 2 else "closed"
