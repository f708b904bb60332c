"""Publish the engine's KV events in vLLM's ZeroMQ format, so other KV-aware routers can read them.

`kvroute engine --kv-events-zmq tcp://127.0.0.1:5557 [--kv-events-replay tcp://127.0.0.1:5558]
[--kv-events-encoding map|array]`, in addition to GET /kv/events (nothing changes there).

- PUB socket, bound (the engine is the stable side: subscribers connect), high-water mark
  100,000; messages `[topic, seq (8 bytes big-endian, from 0), msgpack batch]`.
- One batch per turn of the engine loop: the events of a scheduler step, vLLM's batching.
  The first batch is `AllBlocksCleared`, so a consumer sees a restarted engine start empty.
- `BlockStored`: the engine's own hashes (unsigned 64-bit ints), the parent's hash (None
  for a chain's first block), the blocks' `token_ids` (read from the block manager when the
  event is published), `block_size`, `medium` by tier (device -> GPU, host -> CPU,
  remote -> STORAGE). Stored blocks are split into runs that chain (a block whose parent is
  not the previous one of the event starts a new run), so a consumer's recomputation from
  tokens and parents is exact. A chain seeded other than by the model alone (a `cache_salt`,
  a LoRA adapter) carries its seed as its first block's one extra key,
  `extra_keys: [[["kvroute_hash_seed", seed]], None, ...]`, which kvroute's router reads and
  which marks the chain unroutable for consumers that cannot reproduce it. A block no longer
  in the pool when published (evicted within the same step) is left out; its `BlockRemoved`
  is harmless to consumers.
- Replay: a ROUTER socket answering `[b"", start seq]` with `[b"", seq, payload]` for the
  last `--kv-events-buffer-steps` batches from `start` on, then seq -1 and an empty payload.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Protocol

import zmq
import zmq.asyncio

from kvroute.engine.core.block_manager import Block
from kvroute.engine.core.kv_events import KVEventLog
from kvroute.router.contract.kv_encode import BatchEncoder
from kvroute.router.contract.protocol import KVEvent, hash_seed


class CachedBlocks(Protocol):
    """What a BlockStored event needs of the block pool: a cached block's tokens and parent."""

    block_size: int

    def cached_block(self, block_hash: int) -> Block | None: ...


log = logging.getLogger(__name__)

TIER_MEDIA = {"device": "GPU", "host": "CPU", "remote": "STORAGE"}
END_SEQ = b"\xff" * 8
SNDHWM = 100_000


class ZmqEventPublisher:
    def __init__(self, *, events: KVEventLog, blocks: CachedBlocks, model: str, endpoint: str,
                 replay_endpoint: str | None = None, encoding: str = "map", topic: str = "",
                 buffer_steps: int = 10_000) -> None:
        self.events = events
        self.blocks = blocks
        self.default_seed = hash_seed(model)
        self.encoder = BatchEncoder(encoding)
        self.topic = topic.encode()
        self.ctx = zmq.asyncio.Context()
        self.pub = self._bind(zmq.PUB, endpoint)
        self.pub.setsockopt(zmq.SNDHWM, SNDHWM)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay = self._bind(zmq.ROUTER, replay_endpoint) if replay_endpoint else None
        self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT) if self.replay else None
        self.buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self.seq = 0
        self.pending: list = []
        self._flush_scheduled = False
        self._task: asyncio.Task | None = None
        self.dropped_blocks = 0

    def _bind(self, kind: int, endpoint: str) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            sock.close()
            self.ctx.destroy(linger=0)
            raise OSError(f"cannot bind the KV event socket {endpoint}: {e}") from None
        return sock

    async def start(self) -> None:
        self.pending.append(self.encoder.cleared())
        self._flush()
        self.events.listeners.append(self._on_event)
        if self.replay is not None:
            self._task = asyncio.create_task(self._serve_replay(), name="zmq-kv-replay")
        log.info("publishing KV events in vLLM's format at %s (replay %s)", self.endpoint,
                 self.replay_endpoint or "none")

    async def stop(self) -> None:
        self.events.listeners.remove(self._on_event)
        self._flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.ctx.destroy(linger=0)

    # -- events -> batches --------------------------------------------------------------

    def _on_event(self, event: KVEvent) -> None:
        medium = TIER_MEDIA[event.tier]
        if event.type == "cleared":
            self.pending.append(self.encoder.cleared())
        elif event.type == "removed":
            self.pending.append(self.encoder.removed(event.blocks, medium))
        else:
            self.pending.extend(self._stored_runs(event, medium))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _stored_runs(self, event: KVEvent, medium: str) -> list:
        """BlockStored events, one per run of blocks that chain, with their tokens."""
        pool = self.blocks
        runs: list[list] = []  # [parent, hashes, tokens, extra_keys]
        last = None
        for i, h in enumerate(event.blocks):
            block = pool.cached_block(h)
            if block is None:
                self.dropped_blocks += 1
                last = None  # what follows names a parent no consumer has seen: a new run
                continue
            # A chain's first block has the chain seed as parent, never a block hash. (An event with
            # parent None may also list mid-chain blocks: the re-announcements after clear_cache.)
            chain_start = i == 0 and event.parent is None and (block.parent is None
                                                               or pool.cached_block(block.parent) is None)
            parent = None if chain_start else block.parent
            if chain_start or last is None or parent != last:
                salted = chain_start and block.parent != self.default_seed
                # block 0's extra keys: one item, the seed (router/kvevents/event_keys.py reads it)
                runs.append([parent, [], [], [[["kvroute_hash_seed", block.parent]]] if salted else None])
            runs[-1][1].append(h)
            runs[-1][2].extend(block.token_ids)
            last = h
        for run in runs:
            if run[3] is not None:
                run[3] += [None] * (len(run[1]) - 1)  # one entry per block; the seed is in the first
        return [self.encoder.stored(hashes, parent, tokens, pool.block_size, medium, extra)
                for parent, hashes, tokens, extra in runs]

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self.pending:
            return
        events, self.pending = self.pending, []
        payload = self.encoder.encode(time.time(), events)
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        try:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeps up: it will see the gap and replay

    # -- replay ----------------------------------------------------------------------------

    async def _serve_replay(self) -> None:
        assert self.replay is not None  # bound by start(), which runs this
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("malformed KV event replay request ignored (%d frames)", len(frames))
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
            await self.replay.send_multipart([identity, b"", END_SEQ, b""])

