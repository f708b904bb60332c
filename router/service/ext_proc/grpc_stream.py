"""One gRPC call on the lean server's HTTP/2 connection (router/service/ext_proc/grpc_connection.py),
as its method's handler sees it: `receive` the client's messages in order (None once it is done
writing), `send` messages (waiting while the peer's flow-control windows or the socket are full),
`finish` with a gRPC status. A call the client resets (RST_STREAM): a handler waiting in `receive`
gets None, any other has its task cancelled; neither can send more."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from kvroute.router.service.ext_proc.h2_frames import U32

if TYPE_CHECKING:
    from kvroute.router.service.ext_proc.grpc_connection import H2Connection

# the gRPC status codes the lean server ends calls with (grpc/doc/statuscodes.md), declared here alone
INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 3, 5, 8, 12, 13
HELD_LIMIT = 1 << 20  # bytes of whole messages a handler has not taken yet, past which the peer gets no more window


class Stream:
    __slots__ = ("id", "conn", "inbox", "partial", "held", "deferred", "unacked", "waiter", "remote_done",
                 "send_window", "out", "drained", "head_sent", "finished", "task", "recv_window")

    def __init__(self, stream_id: int, conn: H2Connection, send_window: int, recv_window: int) -> None:
        self.id, self.conn, self.send_window = stream_id, conn, send_window
        self.inbox: deque[bytes] = deque()  # whole messages, without their 5-byte prefix
        self.partial = bytearray()  # the start of the next message
        self.held = 0  # bytes in inbox (with prefixes), not credited to the peer's window yet if over HELD_LIMIT
        self.deferred = 0  # window credit owed once the handler takes messages
        self.unacked = 0  # credit not told the peer yet (told a quarter window at a time)
        self.recv_window = recv_window  # what the peer may still send: granted, less received
        self.waiter: asyncio.Future | None = None
        self.remote_done = False
        self.out = bytearray()  # message bytes waiting for window
        self.drained: asyncio.Future | None = None
        self.head_sent = self.finished = False
        self.task: asyncio.Task | None = None

    # -- what the connection does ----------------------------------------------------------------

    def took(self, data: bytes, max_message: int) -> tuple[int, str] | None:
        """DATA bytes in: whole messages to the inbox; the gRPC status and message ending the call for a
        message over `max_message` (checked on its prefix, before it is gathered) or a compressed one."""
        partial = self.partial
        partial += data
        while len(partial) >= 5:
            if partial[0]:
                return UNIMPLEMENTED, "compressed messages are not accepted (no grpc-encoding is negotiated)"
            n = U32.unpack_from(partial, 1)[0]
            if n > max_message:
                return RESOURCE_EXHAUSTED, f"message of {n} bytes is over the limit of {max_message}"
            if len(partial) < 5 + n:
                break
            self.inbox.append(bytes(partial[5:5 + n]))
            self.held += 5 + n
            del partial[:5 + n]
        self._wake()
        return None

    def ended(self) -> None:
        self.remote_done = True
        self._wake()

    def input_ended(self) -> bool:
        """The call was reset while its handler waits in `receive`: it gets None (no more messages);
        False when the handler is elsewhere (it is cancelled instead)."""
        if self.waiter is None or self.waiter.done():
            return False
        self.inbox.clear()
        self.remote_done = True
        self.waiter.set_result(None)
        return True

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # -- what the handler does -------------------------------------------------------------------

    async def receive(self) -> bytes | None:
        while not self.inbox:
            if self.remote_done:
                return None
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        message = self.inbox.popleft()
        self.held -= 5 + len(message)
        if self.deferred and self.held <= HELD_LIMIT:
            self.conn.credit(self, 0)
        return message

    async def send(self, message: bytes) -> None:
        pending = self.conn.send_message(self, message)
        if pending is not None:
            await pending

    def finish(self, status: int = 0, message: str = "") -> None:
        if not self.finished:
            self.finished = True
            self.conn.finish(self, status, message)
