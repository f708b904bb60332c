"""One publisher's event stream: a SUB socket, delivery in sequence order, replay on a gap.

Sequence numbers start at 0 per publisher and grow by one per batch. On joining (and
after `forget()`), the subscriber asks the replay socket for everything from seq 0, so an
engine that went quiet before the router started is still known. Then, as messages arrive:

- the next seq (or 0 as the first message): delivered.
- a later seq (messages lost, or the router joined late): the missing range is fetched
  from the replay socket. If the replay starts at the missing seq, the stream continues
  as if nothing was lost; otherwise (no replay socket, no answer, or the publisher no
  longer buffers that far back) the sink is reset (its instance cleared) and rebuilt
  from whatever the replay and the live stream still carry.
- an earlier seq, outside the range a replay just delivered: the publisher restarted;
  the sink is reset and the new stream followed from its start.

Live messages that arrive while a replay runs wait in the SUB socket; those the replay
already delivered are dropped. Not detected here: a publisher that restarts and, before
the router sees any of its new messages, publishes past the old seq (the SUB reconnects
silently); that engine is unreachable meanwhile, and the cluster marks an instance down
longer than --index-ttl-s for a resync, which rebuilds the feed. A malformed frame or
payload is logged, counted and skipped; it never stops the stream. A payload that cannot
be decoded still consumes its seq (a replay would return the same bytes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

import zmq
import zmq.asyncio

from router.kvevents.replay import fetch_replay
from router.contract.kv_wire import Batch, BatchDecoder, WireError, split_message

log = logging.getLogger(__name__)

RCVHWM = 100_000  # messages queued in the SUB socket (vLLM's PUB high-water mark)
POLL_MS = 100  # how often an idle subscriber looks at `forget()` requests


class BatchSink(Protocol):
    """Where a subscriber delivers decoded batches, in order."""

    async def on_batch(self, seq: int, batch: Batch) -> None: ...

    async def on_reset(self, reason: str) -> None:
        """Everything learned from this stream so far may be wrong: forget it."""


@dataclasses.dataclass
class SourceStats:
    endpoint: str
    replay_endpoint: str | None
    state: str = "connecting"  # connecting | replaying | live
    next_seq: int | None = None
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    rebuilds: int = 0
    malformed_frames: int = 0
    malformed_payloads: int = 0
    skipped_events: int = 0
    last_batch_time: float | None = None
    last_problem: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Subscriber:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, replay_endpoint: str | None, topic: str,
                 sink: BatchSink, replay_timeout_s: float = 2.0) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.sink = sink
        self.replay_timeout_s = replay_timeout_s
        self.stats = SourceStats(endpoint, replay_endpoint)
        self.decoder = BatchDecoder()
        self._replayed: tuple[int, int] | None = None  # seqs a replay delivered that live may repeat
        self._catch_up = True

    def forget(self) -> None:
        """Start over: fetch the publisher's whole buffer by replay, then follow the live stream."""
        self.stats.next_seq = None
        self._replayed = None
        self._catch_up = True

    async def run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        log.info("subscribed to KV events at %s (replay %s)", self.endpoint, self.replay_endpoint or "none")
        self._catch_up = True
        try:
            while True:
                if self._catch_up:
                    self._catch_up = False
                    await self._replay_history()
                self.stats.state = "live"
                if await sock.poll(POLL_MS):
                    await self.handle(await sock.recv_multipart())
        finally:
            sock.close(linger=0)

    async def _replay_history(self) -> None:
        """Joining (or rejoining) a stream: what the publisher sent before is in its replay buffer.

        Without this, an engine that went quiet before the router subscribed would never be seen.
        """
        if self.replay_endpoint is None or self.stats.next_seq is not None:
            return
        self.stats.replays += 1
        self.stats.state = "replaying"
        replay = await fetch_replay(self.ctx, self.replay_endpoint, 0, self.replay_timeout_s)
        if replay.error is not None or not replay.batches:
            if replay.error is not None:
                self.stats.replay_failures += 1
                self._problem(f"history replay failed ({replay.error}); following the live stream")
            return
        if replay.first > 0:
            await self._reset(f"joined late: the replay buffer starts at seq {replay.first}, earlier blocks are "
                              f"unknown until the engine stores them again")
        for s, payload in replay.batches:
            await self._deliver(s, payload)
        self._replayed = (0, replay.batches[-1][0])

    async def handle(self, frames: list[bytes]) -> None:
        try:
            _, seq, payload = split_message(frames)
        except WireError as e:
            self.stats.malformed_frames += 1
            self._problem(f"malformed message skipped: {e}")
            return
        await self._on_message(seq, payload)

    async def _on_message(self, seq: int, payload: bytes) -> None:
        if self._replayed is not None:
            lo, hi = self._replayed
            if lo <= seq <= hi:
                return  # the replay already delivered it
            self._replayed = None
        expected = self.stats.next_seq
        if expected is not None and seq < expected:
            await self._reset(f"publisher restarted: seq {seq} after {expected - 1}")
            expected = None
        start = 0 if expected is None else expected
        if seq > start:
            await self._recover(start, seq)
            if self.stats.next_seq is not None and seq < self.stats.next_seq:
                return
        await self._deliver(seq, payload)

    async def _recover(self, start: int, seen: int) -> None:
        """Seqs [start, seen) never arrived: replay them, or reset and rebuild."""
        self.stats.gaps += 1
        missed = f"missed batches {start}..{seen - 1}"
        if self.replay_endpoint is None:
            await self._reset(f"{missed} and there is no replay endpoint")
            return
        self.stats.replays += 1
        self.stats.state = "replaying"
        replay = await fetch_replay(self.ctx, self.replay_endpoint, start, self.replay_timeout_s)
        self.stats.state = "live"
        if not replay.reaches(seen - 1):
            self.stats.replay_failures += 1
            await self._reset(f"{missed}; replay failed: {replay.error or 'it ends too early'}")
            return  # rebuild from the live stream alone
        if replay.first > start:  # the publisher no longer buffers that far back
            self.stats.replay_failures += 1
            await self._reset(f"{missed}; the replay buffer starts at seq {replay.first}")
        for s, payload in replay.batches:
            if s >= start:
                await self._deliver(s, payload)
        self._replayed = (seen, replay.batches[-1][0])

    async def _deliver(self, seq: int, payload: bytes) -> None:
        self.stats.next_seq = seq + 1
        try:
            batch = self.decoder.decode(payload)
        except WireError as e:
            self.stats.malformed_payloads += 1
            self._problem(f"batch {seq} skipped: {e}")
            return
        if batch.skipped:
            self.stats.skipped_events += batch.skipped
            self._problem(f"batch {seq}: {batch.skipped} malformed event(s) skipped")
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.stats.last_batch_time = time.time()
        await self.sink.on_batch(seq, batch)

    async def _reset(self, reason: str) -> None:
        self.stats.rebuilds += 1
        self._problem(reason)
        self.stats.next_seq = None
        await self.sink.on_reset(reason)

    def _problem(self, message: str) -> None:
        if message != self.stats.last_problem:
            log.warning("KV events %s: %s", self.endpoint, message)
        self.stats.last_problem = message
