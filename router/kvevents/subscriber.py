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
longer than --index-ttl-s for a resync when it is back, which rebuilds the feed.

Every message is untrusted (docs/architecture.md#trust-rules): a frame larger than
`max_message_bytes` is dropped by ZeroMQ itself (ZMQ_MAXMSGSIZE: libzmq drops the connection
for good, so the subscriber raises FeedLost and its supervisor starts it afresh); a malformed frame
or payload, nesting too deep to decode, or a batch whose events cannot be applied is counted, logged
at most once per `LOG_EVERY_S` per source, and skipped: it never stops the stream. A payload that
cannot be decoded still consumes its seq (a replay would return the same bytes). `stats.heartbeat`
moves every poll, so a supervisor can tell a stalled subscriber from an idle one (router/kvevents/follower.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

import zmq
import zmq.asyncio
import zmq.utils.monitor

from kvroute.router.contract.kv_wire import MAX_MESSAGE_BYTES, Batch, BatchDecoder, WireError, split_message
from kvroute.router.kvevents.replay import fetch_replay

log = logging.getLogger(__name__)

RCVHWM = 100_000  # messages queued in the SUB socket (vLLM's PUB high-water mark)
POLL_MS = 100  # how often an idle subscriber looks at `forget()` requests
LOG_EVERY_S = 10.0  # one warning per source per this many seconds; the counters count every one
# A connection dropped with no reconnect under way for this long is lost (see FeedLost). libzmq reports
# the retry of an ordinary disconnect (EVENT_CONNECT_RETRIED) within about a millisecond of the drop;
# after a frame over ZMQ_MAXMSGSIZE it reports none. At 0.5 s, a poisoned feed took 0.8-1.1 s to apply
# a valid event again, past the chaos run's 1 s bound.
DROPPED_S = 0.2
_MONITORED = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class FeedLost(ConnectionError):
    """The SUB socket's connection is gone for good: libzmq drops a peer that sent a frame over
    ZMQ_MAXMSGSIZE and does not reconnect. The supervisor restarts the feed on a new socket."""


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
    failed_batches: int = 0
    last_batch_time: float | None = None
    last_problem: str | None = None
    heartbeat: float = 0.0  # time.monotonic() of the subscriber's last poll

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Subscriber:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, replay_endpoint: str | None, topic: str,
                 sink: BatchSink, replay_timeout_s: float = 2.0, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.sink = sink
        self.replay_timeout_s = replay_timeout_s
        self.max_message_bytes = max_message_bytes
        self.stats = SourceStats(endpoint, replay_endpoint)
        self._logged_at = float("-inf")
        self._unlogged = 0
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
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sock.get_monitor_socket(_MONITORED)
        sock.connect(self.endpoint)
        log.info("subscribed to KV events at %s (replay %s)", self.endpoint, self.replay_endpoint or "none")
        self._catch_up = True
        dropped_at, next_check = None, 0.0
        try:
            while True:
                if self._catch_up:
                    self._catch_up = False
                    await self._replay_history()
                self.stats.state = "live"
                self.stats.heartbeat = now = time.monotonic()
                if now >= next_check:  # the connection's events every POLL_MS, not per message
                    dropped_at = await self._connection_events(monitor, dropped_at, now)
                    next_check = now + POLL_MS / 1e3
                if await sock.poll(POLL_MS):
                    await self.handle(await sock.recv_multipart())
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)

    async def _connection_events(self, monitor, dropped_at: float | None, now: float) -> float | None:
        """When the connection dropped with no reconnect under way; raises FeedLost past DROPPED_S."""
        while await monitor.poll(0):
            event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())["event"]
            dropped_at = now if event == zmq.EVENT_DISCONNECTED else None
        if dropped_at is not None and now - dropped_at > DROPPED_S:
            raise FeedLost(f"the connection to {self.endpoint} was dropped and is not coming back "
                           f"(a frame over {self.max_message_bytes} bytes?)")
        return dropped_at

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
        try:
            await self.sink.on_batch(seq, batch)
        except Exception as e:  # noqa: BLE001 -- whatever one batch does, the stream goes on
            self.stats.failed_batches += 1
            self._problem(f"batch {seq} could not be applied, skipped: {e!r}"[:300])
            return
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        self.stats.last_batch_time = time.time()

    async def _reset(self, reason: str) -> None:
        self.stats.rebuilds += 1
        self._problem(reason)
        self.stats.next_seq = None
        await self.sink.on_reset(reason)

    def _problem(self, message: str) -> None:
        """Remember the last problem; warn at most once per LOG_EVERY_S (the counters count them all)."""
        self.stats.last_problem = message
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last warning)" if self._unlogged else ""
        log.warning("KV events %s: %s%s", self.endpoint, message, more)
        self._logged_at, self._unlogged = now, 0
