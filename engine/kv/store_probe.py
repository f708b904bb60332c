"""The shared store's links, measured at start-up through the engine's own store path.

`put_many` of encoded entries of this engine's block size, then `get_many` with every entry
checked (engine/kv/store/entry.py), for 1 and `MAX_BLOCKS` blocks, fitted as
`seconds = latency + bytes / bandwidth` (engine/kv/link_estimate.py `fit_link`). The probe's
entries live under a namespace of their own (derived from the engine's, so engines of one layout
overwrite the same few keys at each start) and never mix with real blocks.
"""

from __future__ import annotations

import os
import statistics
import time

import xxhash

from kvroute.engine.core.kv_copies import StoredBlock
from kvroute.engine.kv.link_estimate import fit_link
from kvroute.engine.kv.store import make_store
from kvroute.engine.kv.store.entry import decode, encode
from kvroute.router.contract.tier_costs import Link

MAX_BLOCKS = 4
REPS = 2


def probe_namespace(namespace: str) -> str:
    return f"{xxhash.xxh3_64_intdigest(b'kvroute-store-probe' + namespace.encode()):016x}"


async def store_points(store, namespace: str, payload_bytes: int, sizes, reps: int) -> dict[str, list]:
    """(bytes, median seconds) of `put_many` and of `get_many` + entry checks, per batch size in `sizes`."""
    points: dict[str, list[tuple[int, float]]] = {"store_write": [], "store_read": []}
    payload = os.urandom(payload_bytes)
    for n in sizes:
        blocks = [StoredBlock(h, (0,), None) for h in range(1, n + 1)]
        items = [(b.hash, encode(namespace, b, payload)) for b in blocks]
        writes, reads = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            await store.put_many(items)
            t1 = time.perf_counter()
            for b, v in zip(blocks, await store.get_many([b.hash for b in blocks])):
                decode(v, namespace, b, payload_bytes)
            writes.append(t1 - t0)
            reads.append(time.perf_counter() - t1)
        points["store_write"].append((n * payload_bytes, statistics.median(writes)))
        points["store_read"].append((n * payload_bytes, statistics.median(reads)))
    return points


async def measure_store(url: str, namespace: str, payload_bytes: int, timeout_s: float) -> dict[str, Link]:
    """{"store_write": link, "store_read": link} measured on the store at `url`."""
    ns = probe_namespace(namespace)
    store = make_store(url, ns, timeout_s=max(timeout_s, 5.0))
    try:
        points = await store_points(store, ns, payload_bytes, (1, MAX_BLOCKS), REPS)
    finally:
        await store.close()
    return {name: fit_link(p) for name, p in points.items()}
