"""One store entry: a small header that names and checks the block, then the block's K/V.

Little-endian:

    magic      4 bytes  b"KVB1"
    namespace  u64      layout namespace (base.layout_namespace, as an integer)
    hash       u64      the block's chained hash
    parent     u64      the previous block's hash (the chain seed for a first block)
    checksum   u64      xxh3_64 of the payload
    length     u32      payload bytes
    ntokens    u16      tokens in the block
    tokens     u32 x ntokens
    payload    `length` bytes: the block's K/V, all layers, the runner's layout (kv_pool.py)

`decode` refuses an entry whose namespace, hash, parent, tokens, length or checksum
differ from what the reading engine expects, so a corrupted, truncated, foreign or
colliding entry is never used: the block is recomputed instead.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from kvroute.engine.core.kv_copies import StoredBlock

MAGIC = b"KVB1"
HEADER = struct.Struct("<4sQQQQIH")


class BadEntry(Exception):
    """A store entry that must not be used (the reason is the message)."""


def encode(namespace: str, block: StoredBlock, payload: bytes) -> bytes:
    tokens = np.asarray(block.token_ids, dtype="<u4").tobytes()
    head = HEADER.pack(MAGIC, int(namespace, 16), block.hash, block.parent or 0,
                       xxhash.xxh3_64_intdigest(payload), len(payload), len(block.token_ids))
    return head + tokens + payload


def decode(value: bytes, namespace: str, block: StoredBlock, payload_bytes: int) -> bytes:
    """The payload of `value` if it is exactly `block` under `namespace`; BadEntry otherwise."""
    if len(value) < HEADER.size:
        raise BadEntry(f"entry of {len(value)} bytes is shorter than its header")
    magic, ns, h, parent, checksum, length, ntokens = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise BadEntry("not a kvroute block entry")
    if ns != int(namespace, 16):
        raise BadEntry(f"entry of layout {ns:016x}, not {namespace}")
    if h != block.hash or parent != (block.parent or 0):
        raise BadEntry(f"entry is block {h} after {parent}, not {block.hash} after {block.parent}")
    start = HEADER.size + 4 * ntokens
    if length != payload_bytes or len(value) != start + length:
        raise BadEntry(f"entry holds {len(value) - start} payload bytes, header says {length}, "
                       f"the layout needs {payload_bytes}")
    tokens = tuple(np.frombuffer(value, dtype="<u4", count=ntokens, offset=HEADER.size).tolist())
    if tokens != block.token_ids:
        raise BadEntry("entry tokens differ from the prompt's")
    payload = value[start:]
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        raise BadEntry("entry payload fails its checksum")
    return payload
