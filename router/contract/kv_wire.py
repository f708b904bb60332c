"""Decode vLLM's KV event messages: `[topic, seq, payload]` frames, msgpack batches of events.

The wire format (vLLM's ZeroMQ publisher; SGLang publishes the same):

- frames: topic bytes, sequence number (8 bytes big-endian, from 0 per publisher), payload.
- payload: a batch `ts, events, data_parallel_rank`, either a positional array (vLLM up to
  ~0.25) or a map with those keys (newer).
- events, each either a tagged array `["BlockStored", field, ...]` (trailing defaults may be
  omitted; unknown trailing fields are ignored) or a map with a `"type"` key:
    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
                lora_name, extra_keys, group_idx, ...)
    BlockRemoved(block_hashes, medium, group_idx)
    AllBlocksCleared()
- a block hash is an unsigned 64-bit int or raw bytes (vLLM's 32-byte hashes); both are kept as
  they come (an opaque key: the router never reproduces engine hashes).

Decoding uses msgspec's typed msgpack decoder: one C pass that both parses and validates
(types, tags, token ids in uint32 range), measured as fast as msgpack's untyped `unpackb`
alone (`python -m kvroute.benchmarks.kvevents decode`). A typed batch decoder is kept per
encoding combination and the last one that worked is tried first, since a publisher does
not change encodings. A batch that fails typed decoding is decoded loosely and its events
converted one by one, so one bad event is skipped without losing its batch.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

SEQ_BYTES = 8
SCHEMES = ("tcp://", "ipc://", "inproc://")  # ZeroMQ endpoints a publisher binds and a router connects to
MAX_MESSAGE_BYTES = 16 << 20  # ZMQ_MAXMSGSIZE of the router's sockets: a larger frame is refused unread
END_OF_REPLAY = b"\xff" * SEQ_BYTES  # seq -1: the replay socket's end marker

Hash = int | bytes
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]


class WireError(ValueError):
    """A frame or payload that does not follow the format."""


# What a decoder may raise on hostile bytes: msgspec's own errors, and RecursionError for nesting
# deeper than the interpreter's recursion limit (an `extra_keys` 100,000 arrays deep is 100 KB).
# Each is one bad message, never the end of a feed.
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


# -- events, in both encodings ---------------------------------------------------------------
# Field order is the positional encoding's; the map encoding uses the same names.


class Stored(msgspec.Struct, tag="BlockStored", array_like=True, frozen=True, gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: list[TokenId] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class Removed(msgspec.Struct, tag="BlockRemoved", array_like=True, frozen=True, gc=False):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class Cleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, frozen=True, gc=False):
    pass


class StoredMap(Stored, tag="BlockStored", array_like=False, frozen=True, gc=False):
    pass


class RemovedMap(Removed, tag="BlockRemoved", array_like=False, frozen=True, gc=False):
    pass


class ClearedMap(Cleared, tag="AllBlocksCleared", array_like=False, frozen=True, gc=False):
    pass


Event = Stored | Removed | Cleared
_ARRAY_EVENT = Stored | Removed | Cleared
_MAP_EVENT = StoredMap | RemovedMap | ClearedMap


def _batch_type(array_like: bool, event: Any) -> type:
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("ts", float), ("events", list[event]), ("data_parallel_rank", int | None, None)]
    return msgspec.defstruct("WireBatch", fields, array_like=array_like, frozen=True, gc=False)


class _LooseBatchArray(msgspec.Struct, array_like=True, frozen=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _LooseBatchMap(_LooseBatchArray, array_like=False, frozen=True, gc=False):
    pass


ArrayBatch = _batch_type(True, _ARRAY_EVENT)  # vLLM <= ~0.25, SGLang: arrays throughout
ArrayBatchOfMaps = _batch_type(True, _MAP_EVENT)  # vLLM 0.26: events as maps, the batch positional
MapBatch = _batch_type(False, _MAP_EVENT)  # newer vLLM code: maps throughout
_DECODERS: list[msgspec.msgpack.Decoder[Any]] = [msgspec.msgpack.Decoder(t) for t in
             (ArrayBatch, ArrayBatchOfMaps, _batch_type(False, _ARRAY_EVENT), MapBatch)]
_LOOSE: list[msgspec.msgpack.Decoder[_LooseBatchArray]] = [
    msgspec.msgpack.Decoder(_LooseBatchArray), msgspec.msgpack.Decoder(_LooseBatchMap)]
_EVENT_DECODERS: list[msgspec.msgpack.Decoder[Any]] = [
    msgspec.msgpack.Decoder(_ARRAY_EVENT), msgspec.msgpack.Decoder(_MAP_EVENT)]


class Batch(msgspec.Struct, frozen=True, gc=False):
    """One decoded payload; `skipped` counts events that were malformed and dropped."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    skipped: int = 0


class BatchDecoder:
    """Decodes payloads of any encoding, remembering which one this publisher uses."""

    def __init__(self) -> None:
        self._order = list(range(len(_DECODERS)))

    def decode(self, payload: bytes) -> Batch:
        for pos, i in enumerate(self._order):
            try:
                raw = _DECODERS[i].decode(payload)
            except _DECODE_ERRORS:
                continue
            if pos:
                self._order.insert(0, self._order.pop(pos))
            return Batch(raw.ts, raw.events, raw.data_parallel_rank)
        return _decode_loose(payload)


def _decode_loose(payload: bytes) -> Batch:
    """A batch whose envelope is valid but some events are not: keep the good events."""
    for decoder in _LOOSE:
        try:
            raw = decoder.decode(payload)
            break
        except _DECODE_ERRORS:
            continue
    else:
        raise WireError(f"payload of {len(payload)} bytes is not a KV event batch")
    events, skipped = [], 0
    for item in raw.events:
        event = _decode_event(item)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return Batch(raw.ts, events, raw.data_parallel_rank, skipped)


def _decode_event(item: msgspec.Raw) -> Event | None:
    for decoder in _EVENT_DECODERS:
        try:
            return decoder.decode(item)
        except _DECODE_ERRORS:
            continue
    return None


def parse_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise WireError(f"sequence frame must be {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def split_message(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, seq, payload) of a PUB message."""
    if len(frames) != 3:
        raise WireError(f"a KV event message has 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    return topic, parse_seq(seq), payload


def split_replay(frames: list[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of a replay reply: `[empty, seq, payload]`, or with the topic first."""
    if len(frames) < 2:
        raise WireError(f"a replay reply has at least 2 frames (seq, payload), got {len(frames)}")
    return parse_seq(frames[-2]), frames[-1]
