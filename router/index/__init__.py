"""Block index backends, chosen by name through one registry.

    make_index("memory")
    make_index("redis", url="redis://127.0.0.1:6379/0", prefix="kvroute:idx:")

Options a backend does not take are ignored, so a caller passes the same options
whatever the name (e.g. `url` for an event stream while the index stays in memory).
"""

from __future__ import annotations

import inspect

from kvroute.router.index.base import NO_MATCH, Applied, BlockIndex, IndexUnavailable, PrefixMatch
from kvroute.router.index.breaker import BreakerIndex
from kvroute.router.index.instrumented import InstrumentedIndex
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.index.redis import RedisIndex

INDEXES: dict[str, type] = {"memory": MemoryIndex, "redis": RedisIndex}


def make_index(name: str, **options) -> BlockIndex:
    try:
        cls = INDEXES[name]
    except KeyError:
        raise ValueError(f"unknown index {name!r}: choose one of {sorted(INDEXES)}") from None
    accepted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in accepted})


__all__ = [
    "INDEXES",
    "NO_MATCH",
    "Applied",
    "BlockIndex",
    "BreakerIndex",
    "IndexUnavailable",
    "InstrumentedIndex",
    "MemoryIndex",
    "PrefixMatch",
    "RedisIndex",
    "make_index",
]
