"""Encode KV event batches in vLLM's format (what kvroute engines publish over ZeroMQ).

The structs are wire.py's, so one definition of the format serves decoding and encoding.
Encodings:

    map        events as maps with a "type" key in a positional batch: vLLM 0.26, and what
               vllm-router 0.1.x reads ("KV event batch must be an array" otherwise)
    array      tagged positional arrays in a positional batch: older vLLM, SGLang
    map-batch  maps throughout, the batch too: newer vLLM code

Every field is written, defaults too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvroute.router.contract import kv_wire as wire

ENCODINGS = ("map", "array", "map-batch")
_FAMILIES = {
    "map": (wire.StoredMap, wire.RemovedMap, wire.ClearedMap, wire.ArrayBatchOfMaps),
    "array": (wire.Stored, wire.Removed, wire.Cleared, wire.ArrayBatch),
    "map-batch": (wire.StoredMap, wire.RemovedMap, wire.ClearedMap, wire.MapBatch),
}


class BatchEncoder:
    def __init__(self, encoding: str = "map") -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"KV event encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        self._stored, self._removed, self._cleared, self._batch = _FAMILIES[encoding]
        self._encoder = msgspec.msgpack.Encoder()

    def stored(self, block_hashes: Sequence, parent, token_ids: Sequence[int], block_size: int,
               medium: str | None = "GPU", extra_keys: list[Any] | None = None) -> wire.Stored:
        return self._stored(list(block_hashes), parent, list(token_ids), block_size, None, medium, None, extra_keys)

    def removed(self, block_hashes: Sequence, medium: str | None = "GPU") -> wire.Removed:
        return self._removed(list(block_hashes), medium)

    def cleared(self) -> wire.Cleared:
        return self._cleared()

    def encode(self, ts: float, events: list, data_parallel_rank: int = 0) -> bytes:
        return self._encoder.encode(self._batch(ts, events, data_parallel_rank))
