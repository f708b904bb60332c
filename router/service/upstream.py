"""A lean HTTP/1.1 client for the router's requests to engines: keep-alive pools of raw
asyncio protocols, no per-request machinery beyond parsing the answer.

aiohttp's client costs the router about as much CPU per request as its whole routing
decision (timers, tracing hooks, cookie jar, multidicts, stream readers); on the hot
path the router only needs: POST a body to http://host:port/path (or GET it: the fleet's
load polls and event feeds, router/fleet/kinds/http.py), read the status and a few
headers, then the body whole or as it streams. This does exactly that:

- one pool of idle connections per host:port, most recently used first; a connection
  idle for more than `idle_s` (below the engines' 75 s keep-alive) is closed, not reused;
- bodies framed by Content-Length, chunked transfer encoding or the connection's end;
- `readany()` waits at most `read_timeout_s` for the next bytes (asyncio.TimeoutError), timed by
  one timer per answer, moved on lazily: a wait sets the deadline, and the timer, when it fires
  early (the answer moved on since it was set), re-arms for the rest, so a stream of many chunks
  does not make and cancel a timer per chunk; `read_timeout_s=None`: no timer (the caller bounds
  the wait: the proxy's whole-answer deadline);
- reading pauses when 1 MiB is buffered and nobody reads (a slow client), and resumes;
- a reused connection that the engine closed before answering a single byte is retried
  once on a fresh connection (the engine closed an idle connection as the request went
  out: it never read it);
- errors are aiohttp's types (ClientOSError with the errno, ServerDisconnectedError,
  ClientPayloadError), so callers and router/fleet/upstream_errors.py treat both clients alike.

Only plain http:// engines use it; https:// goes through aiohttp (router/service/proxy.py).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time

import aiohttp

from kvroute.router.fleet.upstream_errors import LookupFailed

HIGH_WATER = 1 << 20
MAX_HEAD = 64 << 10


class Headers(dict):
    """Response headers, names lower-cased; `get` and `in` take any case."""

    def get(self, name: str, default=None):
        return dict.get(self, name.lower(), default)

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name.lower())

    def __getitem__(self, name: str):
        return dict.__getitem__(self, name.lower())


class _Conn(asyncio.Protocol):
    transport: asyncio.Transport  # set by connection_made, before create_connection hands the connection out

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.closed = False
        self.idle_since = time.monotonic()
        self.response: Response | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.response is not None:
            self.response._lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.response is not None:
            self.response._feed(data)
        else:  # bytes nobody asked for: the connection is out of step, drop it
            self.transport.close()

    def pause_writing(self) -> None:  # request bodies are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass


class Response:
    """One answer: `status`, `headers`, then `read()` or `readany()` until b""; `close()` always."""

    def __init__(self, conn: _Conn, pool: Upstream, read_timeout_s: float | None) -> None:
        self._conn, self._pool, self._read_timeout_s = conn, pool, read_timeout_s
        self._deadline = 0.0  # loop time by which the bytes awaited now must come
        self._timer: asyncio.TimerHandle | None = None
        self.status = 0
        self.headers = Headers()
        self._buf = bytearray()  # raw bytes not parsed yet
        self._chunks: collections.deque[bytes] = collections.deque()  # decoded body bytes
        self._buffered = 0
        self._head_done = False
        self._mode = "length"  # "length", "chunked", "close"
        self._left = 0  # length mode: body bytes to come; chunked: bytes left in the current chunk
        self._chunk_state = "size"  # chunked: "size", "data", "crlf", "trailer"
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._reusable = True
        self._paused = False
        self.received_any = False

    @property
    def content(self) -> Response:
        """aiohttp's `response.content.readany()` spelling (a property: an attribute pointing back at
        the response would make every response a reference cycle, freed only by the cyclic GC)."""
        return self

    # -- feeding, from the protocol ------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self.received_any = True
        if self._eof:
            self._reusable = False
            return
        self._buf += data
        try:
            if not self._head_done:
                self._parse_head()
            if self._head_done:
                self._parse_body()
        except ValueError as e:
            self._fail(aiohttp.ClientPayloadError(f"malformed answer: {e}"))
            self._conn.transport.close()
            return
        if self._buffered > HIGH_WATER and not self._paused and not self._eof:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _parse_head(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                raise ValueError("response head too large")
            return
        lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        del self._buf[: end + 4]
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(rest[:3])
        headers = self.headers
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._head_done = True
        # the names are lower-case here: plain dict lookups, no case folding per lookup
        connection = dict.get(headers, "connection", "").lower()
        if version == "HTTP/1.0" and connection != "keep-alive" or connection == "close":
            self._reusable = False
        length = dict.get(headers, "content-length")
        if "chunked" in dict.get(headers, "transfer-encoding", "").lower():
            self._mode = "chunked"
        elif length is not None:
            self._mode, self._left = "length", int(length)
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._mode, self._left = "length", 0
        else:
            self._mode, self._reusable = "close", False
        if self._mode == "length" and self._left == 0:
            self._eof = True

    def _emit(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._buffered += len(data)

    def _parse_body(self) -> None:
        buf = self._buf
        if self._mode == "close":
            self._emit(bytes(buf))
            buf.clear()
        elif self._mode == "length":
            take = min(self._left, len(buf))
            self._emit(bytes(buf[:take]))
            del buf[:take]
            self._left -= take
            if self._left == 0:
                self._eof = True
                if buf:
                    self._reusable = False
        else:
            self._parse_chunked(buf)

    def _parse_chunked(self, buf: bytearray) -> None:
        while buf and not self._eof:
            if self._chunk_state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ValueError("chunk size line too long")
                    return
                self._left = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
                del buf[: end + 2]
                self._chunk_state = "data" if self._left else "trailer"
            elif self._chunk_state == "data":
                take = min(self._left, len(buf))
                self._emit(bytes(buf[:take]))
                del buf[:take]
                self._left -= take
                if self._left == 0:
                    self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                del buf[:2]
                self._chunk_state = "size"
            else:  # trailer lines, then the empty line that ends the body
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if not line:
                    self._eof = True
                    if buf:
                        self._reusable = False

    def _lost(self, exc: BaseException | None) -> None:
        if self._eof:
            return
        if self._mode == "close" and self._head_done and exc is None:
            self._eof = True
        else:
            self._fail(aiohttp.ServerDisconnectedError() if self._head_done or exc is None
                       else aiohttp.ClientOSError(getattr(exc, "errno", None) or 0, str(exc)))
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._reusable = False
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if self._read_timeout_s is not None:
            self._deadline = loop.time() + self._read_timeout_s
            if self._timer is None:
                self._timer = loop.call_at(self._deadline, self._expire)
        try:
            await waiter
        finally:
            self._waiter = None

    def _expire(self) -> None:
        """The read timer: the wait in progress times out if its deadline has passed; else the
        timer moves on to it (no wait in progress: the next one arms it again)."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        loop = waiter.get_loop()
        if loop.time() >= self._deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(self._deadline, self._expire)

    # -- reading, by the caller ------------------------------------------------------

    async def _head(self) -> None:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def readany(self) -> bytes:
        """The body bytes that have arrived (waiting for some), b"" once the body is complete."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait()
        data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._conn.transport.resume_reading()
        return data

    async def read(self, n: int = -1) -> bytes:
        """The whole body (or at most `n` bytes of it)."""
        out = bytearray()
        while n < 0 or len(out) < n:
            data = await self.readany()
            if not data:
                break
            out += data
        if 0 <= n < len(out):
            self._chunks.appendleft(bytes(out[n:]))
            self._buffered += len(out) - n
            del out[n:]
        return bytes(out)

    def close(self) -> None:
        """Done with the answer: the connection goes back to the pool if the body was read whole."""
        if self._timer is not None:  # it holds this response until it fires: not for read_timeout_s more
            self._timer.cancel()
            self._timer = None
        conn, self._conn.response = self._conn, None
        if self._eof and self._reusable and not self._chunks and not conn.closed:
            self._pool._release(conn)
        elif conn.transport is not None:
            conn.transport.close()




def authority(host: str, port: int) -> str:
    """The Host header's value: an IPv6 address in brackets (RFC 9110 7.2), as URLs write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Upstream:
    """Keep-alive connection pools, one per host:port."""

    def __init__(self, idle_s: float = 15.0, max_idle_per_host: int = 256) -> None:
        self.idle_s, self.max_idle_per_host = idle_s, max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def post(self, host: str, port: int, path: str, body: bytes, connect_timeout_s: float,
                   read_timeout_s: float | None) -> Response:
        """POST `body` (JSON) and wait for the answer's head; its body is read from the Response."""
        request = (f"POST {path} HTTP/1.1\r\nHost: {authority(host, port)}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        return await self._request((host, port), request, connect_timeout_s, read_timeout_s)

    async def get(self, host: str, port: int, path: str, connect_timeout_s: float,
                  read_timeout_s: float | None) -> Response:
        """GET `path` (with its query) and wait for the answer's head, as `post` does."""
        request = f"GET {path} HTTP/1.1\r\nHost: {authority(host, port)}\r\n\r\n".encode("latin-1")
        return await self._request((host, port), request, connect_timeout_s, read_timeout_s)

    async def _request(self, key: tuple[str, int], request: bytes, connect_timeout_s: float,
                       read_timeout_s: float | None) -> Response:
        conn = self._take(key)
        if conn is not None:
            response = await self._send(conn, request, read_timeout_s)
            try:
                await response._head()
                return response
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                response.close()
                if response.received_any:
                    raise
            except BaseException:  # a timeout or a cancel while waiting for the head: the connection goes
                response.close()
                raise
        conn = await self._connect(key, connect_timeout_s)
        response = await self._send(conn, request, read_timeout_s)
        try:
            await response._head()
        except BaseException:
            response.close()
            raise
        return response

    async def _send(self, conn: _Conn, request: bytes, read_timeout_s: float | None) -> Response:
        response = Response(conn, self, read_timeout_s)
        conn.response = response
        conn.transport.write(request)
        return response

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < self.idle_s:
                return conn
            conn.transport.close()
        return None

    async def _connect(self, key: tuple[str, int], timeout_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(lambda: _Conn(key), *key)
        except socket.gaierror as e:
            raise LookupFailed(key[0], e) from e
        except OSError as e:
            raise aiohttp.ClientOSError(e.errno or 0, e.strerror or str(e)) from e
        return conn

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle_per_host:
            conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
