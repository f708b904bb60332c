"""One HTTP/2 connection of the lean gRPC server (router/service/ext_proc/grpc_server.py): cleartext
with prior knowledge, as Envoy's gRPC client speaks it, on an asyncio Protocol in the router's event
loop. Frames are read with struct (h2_frames.py), header blocks decoded by header_blocks.py; each call is a
Stream (grpc_stream.py) served by its method's handler in a task.

Flow control both ways: large windows offered (STREAM_WINDOW, CONN_WINDOW), credited back as the
handlers take messages (a handler that falls behind stops the peer); the peer's windows respected
when sending (a sender waits). Limits: MAX_STREAMS at once (more: REFUSED_STREAM), frames over
MAX_FRAME and header blocks over MAX_HEADER_LIST are connection errors (GOAWAY, closed, logged as
one line); writes made in one turn of the loop go out as one."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvroute.router.service.ext_proc import h2_frames as h2
from kvroute.router.service.ext_proc.grpc_sending import Sending
from kvroute.router.service.ext_proc.grpc_stream import HELD_LIMIT, INTERNAL, UNIMPLEMENTED, Stream
from kvroute.router.service.ext_proc.header_blocks import BadHeaderBlock, HeaderBlocks

if TYPE_CHECKING:
    from kvroute.router.service.ext_proc.grpc_server import LeanServer

log = logging.getLogger(__name__)

STREAM_WINDOW, CONN_WINDOW = 1 << 20, 16 << 20
MAX_STREAMS, MAX_FRAME, MAX_HEADER_LIST = 4096, 1 << 20, 16 << 10
MAX_MESSAGE = 4 << 20  # as grpcio's server receives by default
OURS = h2.settings({h2.MAX_CONCURRENT_STREAMS: MAX_STREAMS, h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    h2.MAX_FRAME_SIZE: MAX_FRAME, h2.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST, h2.ENABLE_PUSH: 0})


class H2Connection(Sending, asyncio.Protocol):
    def __init__(self, server: LeanServer) -> None:
        self.server, self.buf = server, bytearray()
        self.loop = asyncio.get_running_loop()  # the server's: kept, not looked up per message
        self.streams: dict[int, Stream] = {}
        self.blocked: dict[Stream, None] = {}
        self.blocks = HeaderBlocks()
        self.preface = False
        self.last_id = 0
        self.headers_of: tuple[int, int, bytearray] | None = None  # (stream, flags, block) until END_HEADERS
        self.peer_window, self.peer_initial, self.peer_frame = h2.DEFAULT_WINDOW, h2.DEFAULT_WINDOW, h2.DEFAULT_FRAME
        self.conn_credit = 0
        self.conn_recv = CONN_WINDOW  # what the peer may still send on the connection: granted, less received
        self.out: list[bytes] = []
        self.paused: asyncio.Future | None = None
        self.going_away = False
        self.transport: asyncio.Transport | None = None

    # -- the socket ------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections.add(self)
        self.write(OURS + h2.window_update(0, CONN_WINDOW - h2.DEFAULT_WINDOW))

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._drop(stream)
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    def pause_writing(self) -> None:
        self.paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)
        self.paused = None
        self._flush_blocked()

    def close(self, code: int = h2.NO_ERROR, message: str = "") -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.write(h2.goaway(self.last_id, code, message))
            self._flush()
            self.transport.close()

    def goaway(self) -> None:
        """No new calls: those in flight may finish (the server stops)."""
        if not self.going_away:
            self.going_away = True
            self.write(h2.goaway(self.last_id, h2.NO_ERROR, "server stopping"))

    # -- frames in -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        try:
            if not self.preface:
                if len(buf) < len(h2.PREFACE):
                    if not h2.PREFACE.startswith(bytes(buf)):
                        raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 prior-knowledge preface")
                    return
                if not buf.startswith(h2.PREFACE):
                    raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 prior-knowledge preface")
                del buf[:len(h2.PREFACE)]
                self.preface = True
            at, end = 0, len(buf)
            while end - at >= 9:
                high, low, kind, flags, stream_id = h2.HEADER.unpack_from(buf, at)
                length = high << 16 | low
                if length > MAX_FRAME:
                    raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes, over {MAX_FRAME}")
                if end - at < 9 + length:
                    break
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(buf[at + 9:at + 9 + length]))
                at += 9 + length
            del buf[:at]
        except h2.ConnectionError_ as e:
            log.info("ext_proc: closing an HTTP/2 connection: %s", e)
            self.close(e.code, str(e))

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.headers_of is not None and kind != h2.CONTINUATION:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == h2.DATA:
            self._data(flags, stream_id, payload)
        elif kind in (h2.HEADERS, h2.CONTINUATION):
            self._headers(kind, flags, stream_id, payload)
        elif kind == h2.RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._drop(stream)
        elif kind == h2.SETTINGS:
            if not flags & h2.ACK:
                self._settings(h2.parse_settings(payload))
        elif kind == h2.PING:
            if len(payload) != 8:
                raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
            if not flags & h2.ACK:
                self.write(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif kind == h2.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == h2.PUSH_PROMISE:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        elif kind == h2.GOAWAY:
            self.going_away = True
        # PRIORITY and unknown frame types are ignored, as the protocol asks

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        data = h2.unpadded(flags, payload) if flags & h2.PADDED else payload
        stream = self.streams.get(stream_id)
        self.conn_recv -= len(payload)
        if stream is not None:
            stream.recv_window -= len(payload)
        if self.conn_recv < 0 or (stream is not None and stream.recv_window < 0):
            raise h2.ConnectionError_(h2.FLOW_CONTROL_ERROR, "DATA over the flow-control window granted")
        if data is not payload:
            self.credit(None, len(payload) - len(data))  # padding: nothing to hold
        if stream is None or stream.remote_done:
            self.credit(None, len(data))
            if stream_id > self.last_id or stream_id == 0:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return
        error = stream.took(data, MAX_MESSAGE)
        self.credit(stream, len(data))
        if error is not None:
            self._end(stream, *error)
        elif flags & h2.END_STREAM:
            stream.ended()

    def credit(self, stream: Stream | None, n: int) -> None:
        """`n` bytes the peer may send again: told in WINDOW_UPDATEs of a quarter window or more; a
        stream's held back while its handler has more than HELD_LIMIT bytes of messages to take."""
        if stream is not None:
            if stream.held > HELD_LIMIT:
                stream.deferred += n
                return
            n += stream.deferred
            stream.deferred = 0
            stream.unacked += n
            if stream.unacked >= STREAM_WINDOW // 4 and stream.id in self.streams and not stream.remote_done:
                self.write(h2.window_update(stream.id, stream.unacked))
                stream.recv_window += stream.unacked
                stream.unacked = 0
        self.conn_credit += n
        if self.conn_credit >= CONN_WINDOW // 4:
            self.write(h2.window_update(0, self.conn_credit))
            self.conn_recv += self.conn_credit
            self.conn_credit = 0

    def _headers(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == h2.HEADERS:
            if self.headers_of is not None or stream_id == 0:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS out of place")
            self.headers_of = (stream_id, flags, bytearray(h2.unpadded(flags, payload, priority=True)))
        else:
            if self.headers_of is None or self.headers_of[0] != stream_id:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self.headers_of[2].extend(payload)
        if len(self.headers_of[2]) > MAX_HEADER_LIST:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, f"header block over {MAX_HEADER_LIST} bytes")
        if not flags & h2.END_HEADERS:
            return
        stream_id, first_flags, block = self.headers_of
        self.headers_of = None
        self._call(stream_id, first_flags, self._decoded(bytes(block)))

    def _decoded(self, block: bytes) -> dict[bytes, bytes]:
        try:
            return self.blocks.decode(block)
        except BadHeaderBlock as e:
            raise h2.ConnectionError_(h2.COMPRESSION_ERROR, f"bad header block: {e}") from None

    def _call(self, stream_id: int, flags: int, fields: dict[bytes, bytes]) -> None:
        if stream_id in self.streams:  # the client's trailers: nothing in them for gRPC, but they may end it
            if flags & h2.END_STREAM:
                self.streams[stream_id].ended()
            return
        if stream_id % 2 == 0:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, f"HEADERS opening even stream {stream_id}")
        if stream_id <= self.last_id:  # a stream closed here already (reset, refused): its late headers
            return  # are ignored (RFC 9113 5.1), never an error that would end every call on the connection
        self.last_id = stream_id
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self.write(h2.rst_stream(stream_id, h2.REFUSED_STREAM))
            return
        stream = Stream(stream_id, self, self.peer_initial, STREAM_WINDOW)
        self.streams[stream_id] = stream
        if flags & h2.END_STREAM:
            stream.remote_done = True
        handler = self.server.methods.get(fields.get(b":path", b""))
        if handler is None or fields.get(b":method") != b"POST":
            path = fields.get(b":path", b"").decode("utf-8", "replace")
            self._end(stream, UNIMPLEMENTED, f"unknown method {path[:100]}")
            return
        stream.task = self.loop.create_task(self._run(handler, stream))

    async def _run(self, handler, stream: Stream) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("ext_proc: a gRPC handler failed")
            stream.finish(INTERNAL, f"{type(e).__name__}")
        else:
            stream.finish()

    def _settings(self, values: dict[int, int]) -> None:
        if h2.INITIAL_WINDOW_SIZE in values:
            size = values[h2.INITIAL_WINDOW_SIZE]
            if size > h2.MAX_WINDOW:
                raise h2.ConnectionError_(h2.FLOW_CONTROL_ERROR, "initial window over 2^31-1")
            for stream in self.streams.values():
                stream.send_window += size - self.peer_initial
            self.peer_initial = size
        if h2.MAX_FRAME_SIZE in values:
            if not h2.DEFAULT_FRAME <= values[h2.MAX_FRAME_SIZE] <= (1 << 24) - 1:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
            self.peer_frame = values[h2.MAX_FRAME_SIZE]
        self.write(h2.SETTINGS_ACK)
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        increment = h2.U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0 or self.peer_window + increment > h2.MAX_WINDOW:
                raise h2.ConnectionError_(h2.FLOW_CONTROL_ERROR, "bad connection WINDOW_UPDATE")
            self.peer_window += increment
        elif (stream := self.streams.get(stream_id)) is not None:
            stream.send_window += increment
        self._flush_blocked()
