"""Ask a publisher's replay socket for the batches from a sequence number on.

vLLM's replay endpoint is a ROUTER socket. A DEALER sends `[b"", start seq (8 bytes
big-endian)]` and receives `[b"", seq, payload]` for each buffered batch with seq >= start
(newer publishers may put the topic first), then seq -1 with an empty payload. A fresh
DEALER per request, so a late answer to a request that timed out is never mistaken for
the next one. Every wait and the size of the answer are bounded.
"""

from __future__ import annotations

import dataclasses
import logging

import zmq
import zmq.asyncio

from kvroute.router.contract.kv_wire import MAX_MESSAGE_BYTES, WireError, split_replay

log = logging.getLogger(__name__)

MAX_REPLAY_BATCHES = 200_000
MAX_REPLAY_BYTES = 512 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Replay:
    """What a replay returned: (seq, payload) in order, or `error` when it could not be used."""

    batches: list[tuple[int, bytes]]
    error: str | None = None

    def reaches(self, seq: int) -> bool:
        """A contiguous run of batches that goes at least up to `seq`."""
        return self.error is None and bool(self.batches) and self.batches[-1][0] >= seq

    @property
    def first(self) -> int:
        """The first batch's seq (asked only of a replay that has batches)."""
        return self.batches[0][0]


async def fetch_replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, timeout_s: float) -> Replay:
    """Batches from `start` on; `timeout_s` bounds each wait for the next reply frame."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        return await _read(sock, endpoint, start, timeout_s)
    except zmq.ZMQError as e:
        return Replay([], f"replay socket error: {e}")
    finally:
        sock.close(linger=0)


async def _read(sock: zmq.asyncio.Socket, endpoint: str, start: int, timeout_s: float) -> Replay:
    batches: list[tuple[int, bytes]] = []
    size, last = 0, start - 1
    while True:
        if not await sock.poll(timeout_s * 1000):
            return Replay(batches, f"no answer from {endpoint} within {timeout_s:g}s")
        try:
            seq, payload = split_replay(await sock.recv_multipart())
        except WireError as e:
            return Replay(batches, f"malformed replay reply: {e}")
        if seq == -1:
            return Replay(batches)
        if seq < start or (batches and seq != last + 1):
            return Replay(batches, f"replay is out of order: seq {seq} after {last}")
        last, size = seq, size + len(payload)
        batches.append((seq, payload))
        if len(batches) > MAX_REPLAY_BATCHES or size > MAX_REPLAY_BYTES:
            return Replay(batches, f"replay larger than {MAX_REPLAY_BATCHES} batches or {MAX_REPLAY_BYTES} bytes")
