"""A bare HTTP/1.1 client for malformed requests, on its own connection per request.

Unlike a normal client it keeps reading while it writes, so a server that answers
(413) before it has read a 50 MB body is heard instead of seen as a broken pipe; it
can send a body chunked, or declare a longer Content-Length than it sends and then
close its side. Every request is `Connection: close` and bounded by `timeout_s`.

`exchange` sends raw bytes as they are (any head, pipelined requests, a body that stops) and
reports every answer's status, interim `100 Continue` included, and whether and when the
server closed the connection after the last one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable

WRITE_CHUNK = 1 << 16


@dataclasses.dataclass
class RawResponse:
    status: int | None  # None: no answer (see `error`)
    headers: dict[str, str]
    body: bytes
    elapsed_s: float
    error: str | None = None  # "timeout", "closed without an answer", ...


@dataclasses.dataclass(frozen=True)
class RawRequest:
    path: str
    body: bytes | Iterable[bytes] = b""  # an iterable is sent piece by piece
    chunked: bool = False
    declared_length: int | None = None  # Content-Length to claim (default: the real length)
    content_type: str = "application/json"

    def head(self, host: str, size: int | None) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {host}", "Connection: close",
                 f"Content-Type: {self.content_type}"]
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {self.declared_length if self.declared_length is not None else size}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def pieces(self) -> Iterable[bytes]:
        if isinstance(self.body, (bytes, bytearray)):
            return (self.body[i : i + WRITE_CHUNK] for i in range(0, len(self.body), WRITE_CHUNK))
        return self.body


async def send(host: str, port: int, req: RawRequest, timeout_s: float = 10.0) -> RawResponse:
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (TimeoutError, OSError) as e:
        return RawResponse(None, {}, b"", time.perf_counter() - t0, f"connect failed: {e!r}")
    answer = asyncio.ensure_future(read_response(reader))
    writing = asyncio.ensure_future(_write(writer, req, host, answer))
    try:
        status, headers, body = await asyncio.wait_for(answer, timeout_s)
        return RawResponse(status, headers, body, time.perf_counter() - t0)
    except TimeoutError:
        return RawResponse(None, {}, b"", time.perf_counter() - t0, f"no answer within {timeout_s:g}s")
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        return RawResponse(None, {}, b"", time.perf_counter() - t0, f"closed without an answer: {e!r}")
    finally:
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        writer.transport.abort()


async def _write(writer: asyncio.StreamWriter, req: RawRequest, host: str, answer: asyncio.Future) -> None:
    """Send head and body; stop early once the answer is in; a write error is not an answer."""
    body = req.body if isinstance(req.body, (bytes, bytearray)) else None
    try:
        writer.write(req.head(host, len(body) if body is not None else None))
        for piece in req.pieces():
            if answer.done():
                return
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if req.chunked else piece)
            await writer.drain()
        if req.chunked:
            writer.write(b"0\r\n\r\n")
        elif req.declared_length is not None and body is not None and req.declared_length > len(body):
            writer.write_eof()  # promised more than we send: the server sees the body end early
        await writer.drain()
    except (OSError, RuntimeError):
        pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exchange:
    statuses: tuple[int, ...]  # every answer in order, interim ones (100) included
    closed_after_s: float | None  # the server closed this long after the last answer; None: it did not
    follow_status: int | None = None  # the answer to the follow-up request, if one came
    error: str | None = None  # "3 answers missing after 5s", "reset: ...", ...


async def exchange(host: str, port: int, data: bytes, answers: int, *, follow: bytes = b"", wait_s: float = 3.0,
                   timeout_s: float = 10.0, local_addr: tuple[str, int] | None = None) -> Exchange:
    """Send `data` on a new connection and read until `answers` final (non-1xx) answers came (the
    server closing first, or `timeout_s`, is an error); then send `follow` (if any) and wait up to
    `wait_s` for its answer or for the server to close."""
    statuses: list[int] = []
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=local_addr), timeout_s)
    except (TimeoutError, OSError) as e:
        return Exchange(statuses=(), closed_after_s=None, error=f"connect failed: {e!r}")
    try:
        writer.write(data)
        try:
            async with asyncio.timeout(timeout_s):
                while sum(s >= 200 for s in statuses) < answers:
                    statuses.append((await read_response(reader))[0])
        except TimeoutError:
            return Exchange(statuses=tuple(statuses), closed_after_s=None,
                            error=f"{answers - len(statuses)} answers missing after {timeout_s:g}s")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            return Exchange(statuses=tuple(statuses), closed_after_s=0.0,
                            error=f"closed before {answers} answers: {e!r}")
        return await _after(reader, writer, tuple(statuses), follow, wait_s)
    finally:
        writer.transport.abort()


async def _after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, statuses: tuple[int, ...],
                 follow: bytes, wait_s: float) -> Exchange:
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(wait_s):
            if follow:
                writer.write(follow)
                follow_status = (await read_response(reader))[0]
                return Exchange(statuses=statuses, closed_after_s=None, follow_status=follow_status)
            while await reader.read(1 << 16):
                pass
    except TimeoutError:
        return Exchange(statuses=statuses, closed_after_s=None)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    return Exchange(statuses=statuses, closed_after_s=time.perf_counter() - t0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {}
    for line in lines:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if status < 200:
        return status, headers, b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.read()
    return status, headers, body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()
