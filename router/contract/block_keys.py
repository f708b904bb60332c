"""What a block's cache key holds beyond its tokens: the adapter, the images, the cache salt.

An engine keys its prefix cache by more than tokens: a block computed under a LoRA adapter,
over an image's placeholder tokens, or for a request with a `cache_salt` is a different block
from one with the same token ids. A request's `RequestKeys` say which of those it carries;
each engine kind declares how its engine folds them into block keys (`KEY_RULES`, named by
`router/fleet/kinds/`), and the router hashes a request the same way, so the index finds
exactly what the engine would reuse (docs/architecture.md#block-keys).

    vllm     vLLM's prefix caching (vllm/v1/core/kv_cache_utils.py): every block's key has the
             adapter's name; each image overlapping the block, its hash and its offset from the
             block's start (negative when it began in an earlier block); the first block, the
             salt. KV events publish those per block (`BlockStored.extra_keys`, vLLM's untagged
             form: `["sql", ["<image hash>", 5], "tenant-a"]`), and the router folds exactly that
             list into the block's hash. tests/unit/test_vllm_key_parity.py holds it to fixtures
             vLLM's own code wrote (kvroute/scripts/vllm_key_fixtures.py).
    seeded   kvroute's engines (and SGLang's, which publish no keys): adapter and salt go into
             the chain's seed (`hash_seed`), images into nothing (these engines take no
             images), so a request's blocks from its first image on are not hashed.

Router hash of block i (`u64le`, `u32le` as in router/contract/protocol.py):

    h[i] = xxh3_64(u64le(h[i-1] or seed) + u32le(tokens of block i))                  no extra keys
    h[i] = xxh3_64(u64le(h[i-1] or seed) + u32le(tokens of block i) + msgpack(extra))  with them

`msgpack(extra)` is the block's extra keys as one msgpack array (strings as str, offsets as
ints, the shortest encoding of each), the same bytes whether the list came from a request or
from an event's `extra_keys`. A block without extra keys hashes as it always has, so plain
requests keep their hashes under every rule.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
import xxhash

from kvroute.router.contract.protocol import block_hashes_of_bytes, hash_seed

_U64 = struct.Struct("<Q")
_EXTRA = msgspec.msgpack.Encoder()


class ImageKey(msgspec.Struct, frozen=True, kw_only=True):
    """One image of a prompt: its hash (as the engine computes it) and its placeholder tokens."""

    hash: str
    offset: int  # the first placeholder token's index in the prompt
    length: int  # placeholder tokens


class RequestKeys(msgspec.Struct, frozen=True, kw_only=True):
    """What a request's block keys carry beyond its tokens.

    `hashable_tokens`: the tokens before the first image that could not be hashed locally (a
    remote URL): the router hashes only the blocks before it (routing on the text prefix); -1
    when every image was hashed."""

    adapter: str | None = None
    salt: str | None = None
    images: tuple[ImageKey, ...] = ()
    hashable_tokens: int = -1

    @property
    def plain(self) -> bool:
        return self.adapter is None and self.salt is None and not self.images and self.hashable_tokens < 0

    def carried(self) -> dict:
        """For explain and metrics: which keys the request carried."""
        return {"adapter": self.adapter, "salt": self.salt is not None, "images": len(self.images),
                "unhashed_from_token": self.hashable_tokens if self.hashable_tokens >= 0 else None}


NO_KEYS = RequestKeys()


def keyed_block_hashes(data: bytes, block_size: int, seed: int, extras: Sequence[Any | None],
                       parent: int | None = None) -> list[int]:
    """The chain over the full blocks of `data` (token ids as u32le) with `extras[i]` (a list, or
    None) folded into block i's hash; blocks past `extras` have none."""
    step = block_size * 4
    n_full = len(data) // step
    last_keyed = max((i for i, e in enumerate(extras[:n_full]) if e), default=-1)
    out: list[int] = []
    prev = seed if parent is None else parent
    for i in range(last_keyed + 1):
        piece = data[i * step:(i + 1) * step]
        extra = extras[i]
        h = xxhash.xxh3_64_intdigest(_U64.pack(prev) + piece + (_EXTRA.encode(list(extra)) if extra else b""))
        out.append(h)
        prev = h
    if last_keyed + 1 < n_full:
        out.extend(block_hashes_of_bytes(data[(last_keyed + 1) * step:n_full * step], block_size, seed, parent=prev))
    return out


def vllm_extra_keys(keys: RequestKeys, block_size: int, num_blocks: int) -> list[tuple | None]:
    """Each block's extra keys as vLLM publishes them in `BlockStored.extra_keys`: the adapter's
    name, then (image hash, offset from the block's start) for each image overlapping the block,
    then the salt on the first block; None for a block with none."""
    images = sorted(keys.images, key=lambda im: im.offset)
    out: list[tuple | None] = []
    for i in range(num_blocks):
        start, end = i * block_size, (i + 1) * block_size
        extra: list[Any] = [keys.adapter] if keys.adapter is not None else []
        extra += [(im.hash, im.offset - start) for im in images
                  if im.length > 0 and im.offset < end and start < im.offset + im.length]
        if i == 0 and keys.salt:
            extra.append(keys.salt)
        out.append(tuple(extra) if extra else None)
    return out


class KeyRule(Protocol):
    """How an engine kind keys its blocks: the router hashes requests and events by it."""

    name: str
    keys_images: bool  # an image's hash is in its blocks' keys (else only the text before it is hashed)

    def request_hashes(self, data: bytes, block_size: int, model: str, keys: RequestKeys) -> list[int]:
        """The router's hashes of a prompt's full blocks (`data`: its ids as u32le)."""
        ...


def _hashable(data: bytes, keys: RequestKeys) -> bytes:
    return data if keys.hashable_tokens < 0 else data[:keys.hashable_tokens * 4]


class VllmKeys:
    name = "vllm"
    keys_images = True

    def request_hashes(self, data: bytes, block_size: int, model: str, keys: RequestKeys) -> list[int]:
        data = _hashable(data, keys)
        seed = hash_seed(model)
        if keys.plain:
            return block_hashes_of_bytes(data, block_size, seed)
        extras = vllm_extra_keys(keys, block_size, len(data) // (4 * block_size))
        return keyed_block_hashes(data, block_size, seed, extras)


class SeededKeys:
    name = "seeded"
    keys_images = False

    def request_hashes(self, data: bytes, block_size: int, model: str, keys: RequestKeys) -> list[int]:
        data = _hashable(data, keys)
        if keys.images:  # an engine of this rule keys no image: hash the text before the first one
            data = data[:min(im.offset for im in keys.images) * 4]
        return block_hashes_of_bytes(data, block_size, hash_seed(model, keys.salt, keys.adapter))


KEY_RULES: dict[str, KeyRule] = {rule.name: rule for rule in (VllmKeys(), SeededKeys())}
