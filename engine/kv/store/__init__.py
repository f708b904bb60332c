"""Shared K/V stores, chosen by URL scheme through one registry.

    make_store("redis://127.0.0.1:6379/0", namespace, timeout_s=0.1)
    make_store("file:///mnt/nvme/kv", namespace)

`check_url` validates a URL's shape (config time); `check_reachable` connects once
(before an engine starts), so a store that is down at start is one clear error
line instead of a server that recomputes everything.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from kvroute.engine.kv.store.base import KVStore, StoreUnavailable, default_store_id, layout_namespace, store_key
from kvroute.engine.kv.store.file_store import FileStore, check_dir
from kvroute.engine.kv.store.redis_store import RedisStore, ping


def _file_path(url: str) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(f"--kv-store {url!r}: a file store URL is file:///absolute/dir")
    return unquote(parts.path)


def _redis(url: str, namespace: str, store_id: str, timeout_s: float) -> KVStore:
    return RedisStore(url, namespace, store_id, timeout_s)


def _file(url: str, namespace: str, store_id: str, timeout_s: float) -> KVStore:
    return FileStore(_file_path(url), namespace, store_id)


STORES: dict[str, Callable[[str, str, str, float], KVStore]] = {"redis": _redis, "rediss": _redis, "file": _file}
REACHABLE: dict[str, Callable[[str, float], None]] = {
    "redis": ping, "rediss": ping, "file": lambda url, timeout_s: check_dir(_file_path(url))}


def check_url(url: str) -> None:
    scheme = urlsplit(url).scheme
    if scheme not in STORES:
        raise ValueError(f"--kv-store must be a redis:// or file:/// URL, got {url!r}")
    if scheme == "file":
        _file_path(url)


def check_reachable(url: str, timeout_s: float = 2.0) -> None:
    """Raise ValueError naming the store and the reason if it cannot be used right now."""
    check_url(url)
    try:
        REACHABLE[urlsplit(url).scheme](url, timeout_s)
    except Exception as e:  # any transport error: one line for the user
        raise ValueError(f"cannot use --kv-store {default_store_id(url)}: {e}") from None


def make_store(url: str, namespace: str, store_id: str = "", timeout_s: float = 0.1) -> KVStore:
    check_url(url)
    return STORES[urlsplit(url).scheme](url, namespace, store_id or default_store_id(url), timeout_s)


__all__ = ["KVStore", "STORES", "StoreUnavailable", "check_reachable", "check_url", "default_store_id",
           "layout_namespace", "make_store", "store_key"]
