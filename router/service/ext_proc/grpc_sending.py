"""The sending half of the lean server's HTTP/2 connection (grpc_connection.py): a call's response
head, its messages as DATA frames within the peer's windows and frame size (a sender waits for
WINDOW_UPDATE, or for the socket to drain), its trailers (grpc-status), and a call dropped.
Everything written in one turn of the event loop goes out as one write."""

from __future__ import annotations

import asyncio

from kvroute.router.service.ext_proc import h2_frames as h2
from kvroute.router.service.ext_proc.grpc_stream import Stream

HEAD_FLAGS = h2.END_HEADERS
TRAILER_FLAGS = h2.END_HEADERS | h2.END_STREAM


class Sending:
    streams: dict[int, Stream]
    blocked: dict[Stream, None]  # the streams with bytes waiting for window, in the order they blocked
    out: list[bytes]
    transport: asyncio.Transport | None
    paused: asyncio.Future | None
    peer_window: int
    peer_frame: int
    loop: asyncio.AbstractEventLoop

    def write(self, data: bytes) -> None:
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def send_message(self, stream: Stream, message: bytes) -> asyncio.Future | None:
        """`message` queued on `stream`; a future to wait on while it cannot all go out yet, else None."""
        if stream.finished or stream.id not in self.streams:
            raise asyncio.CancelledError  # the call is over (reset by the client): its handler stops
        if not stream.head_sent:
            stream.head_sent = True
            self.write(h2.frame(h2.HEADERS, HEAD_FLAGS, stream.id, h2.RESPONSE_HEAD))
        n = 5 + len(message)
        if not stream.out and n <= min(self.peer_window, stream.send_window, self.peer_frame):
            self.write(h2.data_message(stream.id, message))  # all of it fits: one frame, no copy to queue
            self.peer_window -= n
            stream.send_window -= n
            return None if self.paused is None else asyncio.shield(self.paused)
        stream.out += h2.message_prefix(message)
        stream.out += message
        self._send_out(stream)
        if stream.out:
            if stream.drained is None or stream.drained.done():
                stream.drained = self.loop.create_future()
            return stream.drained
        # None while the socket takes more; else shielded: a sender cancelled must not cancel the others' wait
        return None if self.paused is None else asyncio.shield(self.paused)

    def _send_out(self, stream: Stream) -> None:
        """As much of the stream's queued bytes as the windows allow, in frames the peer takes."""
        out = stream.out
        while out and self.peer_window > 0 and stream.send_window > 0:
            n = min(len(out), self.peer_window, stream.send_window, self.peer_frame)
            self.write(h2.frame(h2.DATA, 0, stream.id, bytes(out[:n])))
            del out[:n]
            self.peer_window -= n
            stream.send_window -= n
        if out:
            self.blocked[stream] = None
            return
        self.blocked.pop(stream, None)
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)

    def _flush_blocked(self) -> None:
        for stream in list(self.blocked):
            self._send_out(stream)

    def finish(self, stream: Stream, status: int, message: str) -> None:
        """The call ends with `status`: trailers (trailers alone when nothing was sent), and the
        stream reset if the client is still writing (as gRPC servers do)."""
        if self.streams.get(stream.id) is not stream:
            return
        block = h2.OK_TRAILERS if status == 0 and not message else h2.trailers_block(status, message)
        if not stream.head_sent:
            block = h2.RESPONSE_HEAD + block
        self.write(h2.frame(h2.HEADERS, TRAILER_FLAGS, stream.id, block))
        if not stream.remote_done:
            self.write(h2.rst_stream(stream.id, h2.NO_ERROR))
        self._forget(stream)

    def _end(self, stream: Stream, status: int, message: str) -> None:
        """The call ends here, its handler (if any) cancelled."""
        stream.finished = True
        self.finish(stream, status, message)
        if stream.task is not None:
            stream.task.cancel()

    def _drop(self, stream: Stream) -> None:
        """The client reset the call, or the connection is gone: a handler waiting for a message is
        told its input ended (as Envoy resets every ext_proc call once it has its answers: cheaper than
        a cancellation thrown through it), any other is cancelled; either way it can send no more."""
        stream.finished = True
        self._forget(stream)
        if stream.input_ended():
            return
        if stream.task is not None:
            stream.task.cancel()
        for waiter in (stream.waiter, stream.drained):
            if waiter is not None and not waiter.done():
                waiter.cancel()

    def _forget(self, stream: Stream) -> None:
        self.blocked.pop(stream, None)
        if self.streams.pop(stream.id, None) is not None and stream.deferred:
            # the connection's credit held back for it (its messages were credited as they came in)
            self.credit(None, stream.deferred)
        stream.held = stream.deferred = 0
        stream.partial.clear()

    def credit(self, stream: Stream | None, n: int) -> None:
        raise NotImplementedError  # the connection's (grpc_connection.py)
