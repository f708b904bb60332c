"""The contract shared by engines and routers: block hashing, KV events, load records.

Imports neither torch nor aiohttp: both sides (and the simulator) use it.

Block hashing (DESIGN.md section 2):

    seed_bytes = hash_seed(model, salt) as 8 bytes little-endian
    h[0] = xxh3_64(seed_bytes + tokens[0:bs] as little-endian uint32)
    h[i] = xxh3_64(h[i-1] as 8 bytes little-endian + tokens of block i as little-endian uint32)

Only full blocks are hashed. Hashes are unsigned 64-bit integers (decimal in JSON).
"""

from __future__ import annotations

import dataclasses
import struct
import time
from typing import Iterable, Literal, Sequence

import numpy as np
import xxhash

DEFAULT_BLOCK_SIZE = 16
TIERS = ("device", "host", "remote")
EVENT_TYPES = ("stored", "removed", "cleared")
REDIS_EVENT_STREAM = "kvroute:events"

Tier = Literal["device", "host", "remote"]
EventType = Literal["stored", "removed", "cleared"]

_U64 = struct.Struct("<Q")


def hash_seed(model: str, salt: str | None = None) -> int:
    """The chain's seed for a model and optional salt (LoRA name, request `cache_salt`)."""
    text = "kvroute-v1\x00" + model
    if salt:
        text += "\x00" + salt
    return xxhash.xxh3_64_intdigest(text.encode("utf-8"))


def block_hashes(
    tokens: Sequence[int] | np.ndarray, block_size: int, seed: int, parent: int | None = None
) -> list[int]:
    """Chained hashes of every full block of `tokens` (a partial tail is never hashed).

    `parent` continues an existing chain: pass the hash of the block before `tokens[0]`.
    """
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    data = np.asarray(tokens[: n_full * block_size], dtype="<u4").tobytes()
    step = block_size * 4
    prev = _U64.pack(seed if parent is None else parent)
    out = []
    digest = xxhash.xxh3_64_intdigest
    for i in range(n_full):
        h = digest(prev + data[i * step : (i + 1) * step])
        out.append(h)
        prev = _U64.pack(h)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class KVEvent:
    """One change to an instance's cache: blocks stored, blocks removed, or all cleared."""

    instance: str
    epoch: int
    seq: int
    type: EventType
    tier: Tier = "device"
    blocks: tuple[int, ...] = ()
    parent: int | None = None
    store: str | None = None  # tier "remote": the store key (router/tier_costs.py); shared by its instances

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValueError(f"event type must be one of {EVENT_TYPES}, got {self.type!r}")
        if self.tier not in TIERS:
            raise ValueError(f"event tier must be one of {TIERS}, got {self.tier!r}")

    def to_dict(self) -> dict:
        d = {
            "instance": self.instance,
            "epoch": self.epoch,
            "seq": self.seq,
            "type": self.type,
            "tier": self.tier,
            "blocks": list(self.blocks),
            "parent": self.parent,
        }
        if self.store is not None:
            d["store"] = self.store
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "KVEvent":
        try:
            return cls(
                instance=str(d["instance"]),
                epoch=int(d["epoch"]),
                seq=int(d["seq"]),
                type=d["type"],
                tier=d.get("tier", "device"),
                blocks=tuple(int(b) for b in d.get("blocks") or ()),
                parent=None if d.get("parent") is None else int(d["parent"]),
                store=None if d.get("store") is None else str(d["store"]),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed KV event {d!r}: {e}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class LoadRecord:
    """An instance's load, as served at GET /load and sent along with events."""

    instance: str
    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    queued_prefill_tokens: int
    ts: float = dataclasses.field(default_factory=time.time)
    kv_tiers: dict = dataclasses.field(default_factory=dict)  # measured tier links, router/tier_costs.py

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LoadRecord":
        try:
            return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
        except TypeError as e:
            raise ValueError(f"malformed load record {d!r}: {e}") from None

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks if self.kv_total_blocks else 0.0


def new_epoch() -> int:
    """An epoch id for a (re)started engine: milliseconds since the Unix epoch."""
    return int(time.time() * 1000)


def events_to_json(events: Iterable[KVEvent]) -> list[dict]:
    return [e.to_dict() for e in events]
