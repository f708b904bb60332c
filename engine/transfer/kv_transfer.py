"""Prefill/decode KV transfer: handles, pinned blocks, the link handshake and the pull stream.

A prefill engine asked to (`kv_transfer_params: {"do_remote_decode": true}`) computes
the prompt and its first token, keeps the prompt's blocks pinned for `ttl_s`, and
answers with a `TransferHandle`. A decode engine given the original request plus
that handle (`{"do_remote_prefill": true, "handle": {...}}`) links to the prefill's
cluster once (model, dtype, block size, layers, KV heads and head dim must match),
admits the request when it has the blocks free, and *pulls* the blocks it does not
already hold in its own prefix cache with POST {address}/kv/transfer.

Wire format of the pull (a binary HTTP body), one frame per block, then an end frame:

    frame   = header payload
    header  = <u32 block index> <u64 block hash> <u64 xxh3_64(payload)> <u32 payload length>
              (little-endian; block hash 0 for the prompt's partial last block)
    payload = that block's K/V, all layers, in the runner's layout (kv_pool.py)
    end     = header with block index 0xFFFFFFFF and zeros

The decode side checks each frame's payload length (before reading it) against its own
block size, its block hash against the hash it computes from the prompt, and the
payload against its checksum; a block that fails is never used (the decode engine then
computes the missing blocks itself). None of this says where the data came from: that
is the handle's signature (router/contract/kv_auth.py), checked before any connection is made.

A handle is bound to its whole prompt: `block_hashes` covers the full blocks and `tail_hash`
the partial last block's tokens (`tail_hash` below: the chain's next hash over them, 0 when the
prompt ends on a block boundary). A decode engine pulls only for a request whose own prompt
gives the same full-block hashes and the same tail hash (`binds`); a handle replayed with
another prompt, or re-targeted at another request, is computed locally and never written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import xxhash

from kvroute.router.contract.errors import BadRequest
from kvroute.router.contract.protocol import block_hashes, u32le

FRAME = struct.Struct("<IQQI")
END_INDEX = 0xFFFFFFFF
LINK_FIELDS = ("model", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim")


class TransferError(Exception):
    """A pull failed or a block failed verification."""


class LinkMismatch(BadRequest):
    code = "kv_link_mismatch"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TransferHandle:
    cluster_id: str
    address: str  # base URL of the prefill engine, as the router's grant named it
    request_id: str
    block_hashes: tuple[int, ...]  # the prompt's full blocks
    num_tokens: int  # prompt tokens whose K/V the prefill holds
    first_token: int
    cached_tokens: int = 0  # prefix-cache hit on the prefill side
    expires: float = 0.0  # unix time after which the pin is gone
    tail_hash: int = 0  # the partial last block's tokens (`tail_hash`), 0: none
    signature: str | None = None  # HMAC by the prefill engine (router/contract/kv_auth.py)

    def signed_fields(self) -> list:
        return [self.cluster_id, self.address, self.request_id, list(self.block_hashes), self.num_tokens,
                self.first_token, self.cached_tokens, self.expires, self.tail_hash]

    def binds(self, tokens, block_size: int, seed: int) -> str | None:
        """Why this handle may not fill a request whose prompt is `tokens` (None: it may)."""
        if self.num_tokens > len(tokens):
            return f"the handle covers {self.num_tokens} tokens, the prompt has {len(tokens)}"
        prompt = tokens[: self.num_tokens]
        own = block_hashes(prompt, block_size, seed)
        if tuple(own) != self.block_hashes:
            return "the handle's block hashes are not this prompt's"
        if tail_hash(prompt, block_size, seed, own[-1] if own else None) != self.tail_hash:
            return "the handle's partial last block is not this prompt's"
        return None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["block_hashes"] = list(self.block_hashes)
        return d

    @classmethod
    def from_dict(cls, d) -> TransferHandle:
        try:
            hashes = tuple(int(h) for h in d["block_hashes"])
            if any(not 0 <= h < 1 << 64 for h in hashes):
                raise ValueError("block hashes are unsigned 64-bit integers")
            signature = d.get("signature")
            return cls(cluster_id=str(d["cluster_id"]), address=str(d["address"]), request_id=str(d["request_id"]),
                       block_hashes=hashes, num_tokens=int(d["num_tokens"]), first_token=int(d["first_token"]),
                       cached_tokens=int(d.get("cached_tokens", 0)), expires=float(d.get("expires", 0.0)),
                       tail_hash=int(d.get("tail_hash", 0)), signature=None if signature is None else str(signature))
        except (KeyError, TypeError, ValueError) as e:
            raise BadRequest(f"malformed kv_transfer_params.handle: {e!r}", param="kv_transfer_params") from None


def tail_hash(tokens, block_size: int, seed: int, parent: int | None) -> int:
    """The partial last block's digest: xxh3_64(parent hash, or the seed, as 8 bytes LE + its tokens as
    LE uint32), as a full block's would be; 0 when `tokens` end on a block boundary."""
    tail = tokens[len(tokens) // block_size * block_size:]
    if not len(tail):
        return 0
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", seed if parent is None else parent) + u32le(tail))


def encode_frames(blocks: list[tuple[int, int, bytes]]) -> Iterator[bytes]:
    """Frames for (block index, block hash, payload) triples, then the end frame."""
    for index, block_hash, payload in blocks:
        yield FRAME.pack(index, block_hash, xxhash.xxh3_64_intdigest(payload), len(payload)) + payload
    yield FRAME.pack(END_INDEX, 0, 0, 0)


async def read_frames(content: aiohttp.StreamReader, payload_bytes: int) -> AsyncIterator[tuple[int, int, bytes]]:
    """Verified (index, hash, payload) frames; TransferError on a wrong length (checked before
    reading the payload), a bad checksum or a short stream."""
    while True:
        try:
            header = await content.readexactly(FRAME.size)
        except asyncio.IncompleteReadError:
            raise TransferError("transfer stream ended before its end frame") from None
        index, block_hash, checksum, length = FRAME.unpack(header)
        if index == END_INDEX:
            return
        if length != payload_bytes:
            raise TransferError(f"block {index} has a {length}-byte payload; this engine's blocks are "
                                f"{payload_bytes} bytes")
        try:
            payload = await content.readexactly(length) if length else b""
        except asyncio.IncompleteReadError:
            raise TransferError(f"transfer stream cut inside block {index}") from None
        if xxhash.xxh3_64_intdigest(payload) != checksum:
            raise TransferError(f"block {index} failed its checksum")
        yield index, block_hash, payload


def check_link(local: dict, remote: dict) -> None:
    """Refuse a link whose K/V layout differs from ours, naming every difference."""
    problems = [f"{f} {remote.get(f)!r} != ours {local.get(f)!r}" for f in LINK_FIELDS if remote.get(f) != local.get(f)]
    if problems:
        raise LinkMismatch(f"cannot link to prefill cluster {remote.get('cluster_id')!r}: " + "; ".join(problems))


class Links:
    """Verified links to prefill clusters, keyed by cluster id (the handshake runs once)."""

    def __init__(self, local_info: dict) -> None:
        self.local_info = local_info
        self.verified: dict[str, str] = {}  # cluster id -> address

    async def ensure(self, session: aiohttp.ClientSession, handle: TransferHandle) -> None:
        if self.verified.get(handle.cluster_id) == handle.address:
            return
        async with session.get(handle.address + "/kv/info", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:
                raise TransferError(f"prefill {handle.address} answered /kv/info with HTTP {r.status}")
            remote = await r.json()
        if remote.get("cluster_id") != handle.cluster_id:
            raise TransferError(f"{handle.address} is cluster {remote.get('cluster_id')!r}, "
                                f"not {handle.cluster_id!r}")
        check_link(self.local_info, remote)
        self.verified[handle.cluster_id] = handle.address


class PinnedBlocks:
    """Prefill side: block tables held for a pull, released when pulled or after `ttl_s`."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.pinned: dict[str, tuple[object, float]] = {}  # request id -> (sequence, expiry)
        self.expired = 0

    def pin(self, seq) -> None:
        self.pinned[seq.request_id] = (seq, time.monotonic() + self.ttl_s)

    def get(self, request_id: str):
        entry = self.pinned.get(request_id)
        return entry[0] if entry else None

    def pop(self, request_id: str):
        entry = self.pinned.pop(request_id, None)
        return entry[0] if entry else None

    def pop_expired(self, now: float | None = None) -> list:
        now = time.monotonic() if now is None else now
        gone = [rid for rid, (_, expiry) in self.pinned.items() if expiry <= now]
        self.expired += len(gone)
        return [self.pinned.pop(rid)[0] for rid in gone]
