"""The contract shared by engines and routers: block hashing, KV events, load records.

Imports neither torch nor aiohttp: both sides (and the simulator) use it.

Block hashing (docs/architecture.md#block-hashing):

    seed_bytes = hash_seed(model, salt) as 8 bytes little-endian
    h[0] = xxh3_64(seed_bytes + tokens[0:bs] as little-endian uint32)
    h[i] = xxh3_64(h[i-1] as 8 bytes little-endian + tokens of block i as little-endian uint32)

Only full blocks are hashed. Hashes are unsigned 64-bit integers (decimal in JSON).
Where `pip install` could compile router/contract/_chainhash.c, the chain and the packing
of list/tuple ids run in C (one call per prompt instead of a Python step per block; checked
against the Python code at import); elsewhere, or with KVROUTE_NO_EXTENSION=1, in the Python code
below (`CHAIN_IN_C` says which).

Load records (GET /load; docs/architecture.md#load-records) carry the queue and pool
figures plus, from engines that have them (defaults mean "not reported"), what a
placement would evict:
`kv_free_blocks`, blocks holding nothing (allocated without evicting), and
`kv_evictable`, the cached blocks no request holds as [[blocks, idle seconds], ...]
in eviction order (least recently used first; at most MAX_EVICTABLE_BUCKETS
pairs, each the mean idle time of that many blocks): an allocation of n blocks
takes the free ones first, then the first n - kv_free_blocks of those.
"""

from __future__ import annotations

import array
import dataclasses
import os
import struct
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import xxhash

DEFAULT_BLOCK_SIZE = 16
TIERS: tuple[Tier, ...] = ("device", "host", "remote")
ROLES = ("both", "prefill", "decode")  # an engine's prefill/decode disaggregation role
EVENT_TYPES = ("stored", "removed", "cleared")
REDIS_EVENT_STREAM = "kvroute:events"
MAX_EVICTABLE_BUCKETS = 64

Tier = Literal["device", "host", "remote"]
EventType = Literal["stored", "removed", "cleared"]

_U64 = struct.Struct("<Q")


def hash_seed(model: str, salt: str | None = None, adapter: str | None = None) -> int:
    """The chain's seed for a model, an optional salt (a request's `cache_salt`) and an optional
    LoRA adapter (the name the request's `model` gave)."""
    text = "kvroute-v1\x00" + model
    if salt:
        text += "\x00" + salt
    seed = xxhash.xxh3_64_intdigest(text.encode("utf-8"))
    if adapter:
        seed = xxhash.xxh3_64_intdigest(b"kvroute-adapter\x00" + _U64.pack(seed) + adapter.encode("utf-8"))
    return seed


def block_hashes(
    tokens: Sequence[int] | np.ndarray, block_size: int, seed: int, parent: int | None = None
) -> list[int]:
    """Chained hashes of every full block of `tokens` (a partial tail is never hashed).

    `parent` continues an existing chain: pass the hash of the block before `tokens[0]`.
    """
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    return block_hashes_of_bytes(u32le(tokens[: n_full * block_size]), block_size, seed, parent)


def block_hashes_of_bytes(data: bytes, block_size: int, seed: int, parent: int | None = None) -> list[int]:
    """`block_hashes` of token ids already encoded as little-endian uint32 bytes."""
    if _chain is not None:
        return _chain(data, block_size, seed if parent is None else parent)
    return py_block_hashes_of_bytes(data, block_size, seed, parent)


def py_block_hashes_of_bytes(data: bytes, block_size: int, seed: int, parent: int | None = None) -> list[int]:
    """`block_hashes_of_bytes` in Python: the fallback, and the reference the C chain is held to."""
    step = block_size * 4
    n_full = len(data) // step
    pack, digest = _U64.pack, xxhash.xxh3_64_intdigest
    prev = pack(seed if parent is None else parent)
    out = [0] * n_full
    offset = 0
    for i in range(n_full):
        h = digest(prev + data[offset : offset + step])
        out[i] = h
        prev = pack(h)
        offset += step
    return out


def _load_extension():
    """(chain, u32le) from router/contract/_chainhash.c if it was built, agrees with the Python code
    on a probe, and KVROUTE_NO_EXTENSION is not set; else (None, None)."""
    if os.environ.get("KVROUTE_NO_EXTENSION"):
        return None, None
    try:
        from kvroute.router.contract._chainhash import chain
        from kvroute.router.contract._chainhash import u32le as pack
    except ImportError:
        return None, None
    probe = bytes(range(256)) * 9
    ids = [0, 1, 255, 256, 65535, 65536, 2**31, 2**32 - 1]
    ok = pack(ids) == py_u32le(ids) and all(chain(probe, bs, seed) == py_block_hashes_of_bytes(probe, bs, seed)
                                            for bs in (1, 16, 40) for seed in (0, 2**64 - 1))
    if not ok:
        warnings.warn("router/contract/_chainhash disagrees with the Python block hashing; using Python",
                      RuntimeWarning, stacklevel=2)
        return None, None
    return chain, pack


def u32le(tokens) -> bytes:
    """Token ids as little-endian uint32 bytes. An id outside 0..2**32-1 raises OverflowError."""
    if _pack is not None and type(tokens) in (list, tuple):
        return _pack(tokens)
    return py_u32le(tokens)


def py_u32le(tokens) -> bytes:
    """`u32le` in Python (array('I') is 3x faster than numpy from a list)."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype("<u4", copy=False).tobytes()
    ids = array.array("I", tokens)
    if ids.itemsize != 4:
        return np.asarray(tokens, dtype="<u4").tobytes()
    if sys.byteorder != "little":
        ids.byteswap()
    return ids.tobytes()


_chain, _pack = _load_extension()
CHAIN_IN_C = _chain is not None


def _u64s(values) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if any(not 0 <= v <= 0xFFFFFFFFFFFFFFFF for v in out):
        raise ValueError("block hashes are unsigned 64-bit integers")
    return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KVEvent:
    """One change to an instance's cache: blocks stored, blocks removed, or all cleared."""

    instance: str
    epoch: int
    seq: int
    type: EventType
    tier: Tier = "device"
    blocks: tuple[int, ...] = ()
    parent: int | None = None
    store: str | None = None  # tier "remote": the store key (router/contract/tier_costs.py); shared by its instances

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
    def from_dict(cls, d: dict) -> KVEvent:
        try:
            return cls(
                instance=str(d["instance"]),
                epoch=int(d["epoch"]),
                seq=int(d["seq"]),
                type=d["type"],
                tier=d.get("tier", "device"),
                blocks=_u64s(d.get("blocks") or ()),
                parent=None if d.get("parent") is None else int(d["parent"]),
                store=None if d.get("store") is None else str(d["store"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed KV event: {e!r}") from None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoadRecord:
    """An instance's load, as served at GET /load and sent along with events."""

    instance: str
    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    queued_prefill_tokens: int
    ts: float = dataclasses.field(default_factory=time.time)
    state: str = "ready"  # "draining": taking no new requests (routers stop sending at once)
    role: str = ""  # the engine's role now ("" from engines that do not say); routers regroup on change
    kv_free_blocks: int = -1  # blocks holding nothing; -1: not reported
    kv_evictable: tuple[tuple[int, float], ...] = ()  # (blocks, idle s) of evictable blocks, next evicted first
    kv_tiers: dict = dataclasses.field(default_factory=dict)  # measured tier links, router/contract/tier_costs.py
    progress: int = -1  # grows while the engine works (tokens its steps computed); -1: not reported
    adapters: tuple[str, ...] = ()  # LoRA adapters resident in its slots now (loading another costs time)
    adapter_slots: int = -1  # how many adapters it holds at once (vLLM's max_loras); -1: not reported

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # not asdict: no deep copy
        d["kv_evictable"] = [list(pair) for pair in self.kv_evictable]
        return d

    @classmethod
    def from_dict(cls, d: object) -> LoadRecord:
        """Parse and type-check a record from another process (unknown keys are ignored)."""
        if not isinstance(d, dict):
            raise ValueError(f"a load record must be an object, got {type(d).__name__}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            value, want = d[f.name], _NUMBER_TYPES.get(f.type)
            if f.name == "kv_evictable":
                try:
                    value = _evictable(value)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"malformed load record: {e}") from None
            elif f.name == "adapters":
                if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
                    raise ValueError(f"malformed load record: adapters must be a list of names, got {value!r}")
                value = tuple(value)
            elif f.name == "kv_tiers":
                if not isinstance(value, dict):
                    raise ValueError(f"malformed load record: kv_tiers must be an object, got {value!r}")
            elif f.name in _UNREPORTED_FIELDS:  # -1: not reported
                if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                    raise ValueError(f"malformed load record: {f.name} must be an integer >= -1, got {value!r}")
            elif want is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"malformed load record: {f.name} must be a non-negative number, got {value!r}")
                value = want(value)
            elif f.type == "str":
                value = str(value)
            values[f.name] = value
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise ValueError(f"malformed load record: {e}") from None

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks if self.kv_total_blocks else 0.0


# dataclass field annotations (strings: postponed evaluation)
_NUMBER_TYPES: dict[object, type] = {"int": int, "float": float}
# integers where -1 means "not reported"
_UNREPORTED_FIELDS = frozenset({"kv_free_blocks", "progress", "adapter_slots"})


def _evictable(value: object) -> tuple[tuple[int, float], ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_EVICTABLE_BUCKETS:
        raise ValueError(f"kv_evictable must be a list of at most {MAX_EVICTABLE_BUCKETS} [blocks, idle_s] pairs")
    out = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"kv_evictable entries are [blocks, idle seconds] pairs, got {pair!r}")
        blocks, idle = int(pair[0]), float(pair[1])
        if blocks < 0 or not idle >= 0:
            raise ValueError(f"kv_evictable entries are [blocks >= 0, idle seconds >= 0], got {pair!r}")
        out.append((blocks, idle))
    return tuple(out)


def new_epoch() -> int:
    """An epoch id for a (re)started engine: milliseconds since the Unix epoch."""
    return int(time.time() * 1000)


def events_to_json(events: Iterable[KVEvent]) -> list[dict]:
    return [e.to_dict() for e in events]
