"""The `KVStore` protocol: a store of K/V blocks shared by many engines, keyed by block hash.

A store holds opaque values (engine/kv/store/entry.py encodes and checks them) under
one layout namespace: engines whose K/V layout differs (model, dtype, block size,
layers, KV heads, head dim, hash seed) get different namespaces and never read each
other's entries. Backends: `redis://` (redis_store.py) and `file:///dir`
(file_store.py), chosen by URL scheme in `engine.kv.store.STORES`. Backends raise
what their transport raises; `GuardedStore` (guard.py) turns that, and slowness,
into "recompute" for the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson
import xxhash


class KVStore(Protocol):
    store_id: str  # engines with the same id (and namespace) share entries

    async def put_many(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Store each (block hash, value); a reader never sees a partly written value."""

    async def get_many(self, hashes: Sequence[int]) -> list[bytes | None]:
        """The value of each hash, None where absent."""

    async def contains_many(self, hashes: Sequence[int]) -> list[bool]:
        """Whether each hash has a value (cheaper than reading it)."""

    async def close(self) -> None: ...


class StoreUnavailable(Exception):
    """The store failed or did not answer in time; the engine recomputes instead."""


def layout_namespace(model: str, dtype: str, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                     hash_seed: int) -> str:
    """16 hex digits naming a K/V layout: two engines share store entries only if all of these match."""
    layout = {"model": model, "dtype": dtype, "block_size": block_size, "num_layers": num_layers,
              "num_kv_heads": num_kv_heads, "head_dim": head_dim, "hash_seed": hash_seed}
    return f"{xxhash.xxh3_64_intdigest(orjson.dumps(layout, option=orjson.OPT_SORT_KEYS)):016x}"


def default_store_id(url: str) -> str:
    """The URL without credentials, query or fragment: what instances sharing one store have in common."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") or parts.path, "", ""))


def store_key(store_id: str, namespace: str) -> str:
    """What an engine advertises and tags remote events with: store and layout together."""
    return f"{store_id}#{namespace}"
