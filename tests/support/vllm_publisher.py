"""A KV event publisher written from vLLM's wire format (issue 12), for tests.

Independent of kvroute's own code: plain msgpack and pyzmq. A PUB socket sends
`[topic, seq (8 bytes big-endian), msgpack batch]`; a ROUTER socket answers replay
requests `[identity, b"", start seq]` with `[identity, b"", seq, payload]` for every
buffered batch from `start` on, then `[identity, b"", eight 0xFF bytes, b""]`.

Encodings: `events="array"` gives tagged arrays `["BlockStored", hashes, parent, tokens,
block_size, lora_id, medium, lora_name, extra_keys, group_idx]` with trailing defaults
dropped, `events="map"` maps with a "type" key; `batch="array"` a positional
`[ts, events, data_parallel_rank]`, `batch="map"` a map. Engine hashes are 8-byte ints
(often above 2**63) or 32 raw bytes, chained with sha256 over parent and tokens: nothing
like the router's own hashes.
"""

from __future__ import annotations

import collections
import hashlib
import struct
import threading
import time

import msgpack
import zmq

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def engine_hashes(tokens, block_size, parent=None, kind="int", salt=b""):
    """A chain of engine block hashes over full blocks of `tokens`."""
    out = []
    prev = b"" if parent is None else (parent if isinstance(parent, bytes) else parent.to_bytes(8, "big"))
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        digest = hashlib.sha256(salt + prev + struct.pack(f"<{len(block)}I", *block)).digest()
        h = digest if kind == "bytes" else int.from_bytes(digest[:8], "big")
        out.append(h)
        prev = digest if kind == "bytes" else digest[:8]
    return out


def stored(block_hashes, parent, token_ids, block_size=16, medium="GPU", lora_id=None, lora_name=None,
           extra_keys=None, group_idx=None):
    return ("BlockStored", dict(block_hashes=list(block_hashes), parent_block_hash=parent,
                                token_ids=list(token_ids), block_size=block_size, lora_id=lora_id, medium=medium,
                                lora_name=lora_name, extra_keys=extra_keys, group_idx=group_idx))


def removed(block_hashes, medium="GPU", group_idx=None):
    return ("BlockRemoved", dict(block_hashes=list(block_hashes), medium=medium, group_idx=group_idx))


def cleared():
    return ("AllBlocksCleared", {})


def encode_event(event, events="array"):
    tag, fields = event
    if events == "map":
        return {"type": tag, **{k: v for k, v in fields.items() if v is not None or k == "parent_block_hash"}}
    names = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS if tag == "BlockRemoved" else ()
    values = [fields.get(n) for n in names]
    while len(values) > 3 and values[-1] is None:  # trailing defaults omitted, as msgspec does
        values.pop()
    return [tag, *values]


def encode_batch(evs, ts=None, dp_rank=0, events="array", batch="array"):
    body = [encode_event(e, events) for e in evs]
    ts = time.time() if ts is None else ts
    obj = [ts, body, dp_rank] if batch == "array" else {"ts": ts, "events": body, "data_parallel_rank": dp_rank}
    return msgpack.packb(obj)


class VllmPublisher:
    """PUB (an XPUB, to see subscribers) + replay ROUTER on 127.0.0.1 (free ports); `close()` when done."""

    def __init__(self, events="array", batch="array", topic=b"kv@test", replay=True, buffer_steps=1000):
        self.events, self.batch, self.topic = events, batch, topic
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)  # a PUB that also sees subscriptions (wait_subscribed)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.seq = 0
        self.replay_requests = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.replay_endpoint = None
        self._thread = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def publish(self, evs, ts=None, send=True, raw_payload=None):
        """Encode and publish one batch; `send=False` buffers it for replay only (a lost message)."""
        payload = raw_payload if raw_payload is not None else encode_batch(evs, ts, 0, self.events, self.batch)
        with self._lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def wait_subscribed(self, timeout_s=5.0):
        """Block until a subscriber's subscription arrives (so nothing sent after is lost)."""
        if not self.pub.poll(timeout_s * 1000):
            raise TimeoutError("no subscriber connected")
        self.pub.recv()

    def send_raw(self, frames):
        self.pub.send_multipart(frames)

    def restart(self):
        """As a restarted engine: seq from 0, empty replay buffer."""
        with self._lock:
            self.seq = 0
            self.buffer.clear()

    def _serve_replay(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            identity, _, start = frames
            start = int.from_bytes(start, "big")
            self.replay_requests.append(start)
            with self._lock:
                items = [(s, p) for s, p in self.buffer if s >= start]
            for s, p in items:
                self.router.send_multipart([identity, b"", s.to_bytes(8, "big"), p])
            self.router.send_multipart([identity, b"", b"\xff" * 8, b""])

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.router.close()
        self.pub.close()
        self.ctx.term()
