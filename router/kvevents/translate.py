"""Turn an engine's KV events into index operations on the router's own block hashes.

The router never reproduces an engine's hash function (vLLM's changes between versions
and depends on its settings). A `BlockStored` carries the stored blocks' `token_ids`, so
the router recomputes its own chained hashes (router/contract/protocol.py) from them, and keeps,
per instance, a map from each engine block hash to what it knows about that block:

    base    router hash of the last router block that ends at or before the block's end
            (None: the chain seed, i.e. no full router block yet)
    fill    tokens after `base` up to the block's end (0 <= fill < router block size)
    tokens  the block's own tokens among those `fill` (kept only when fill > 0)
    covers  router blocks overlapping this engine block that are complete (removing the
            engine block removes them); `own` of them were completed by this block
    refs    how many times each tier holds it (duplicates are counted, not collapsed)

A child block (`parent_block_hash` = a known engine hash) continues from its parent's
`base` and tail, so engine blocks of any size map onto router blocks of another size:
vLLM's 16-token blocks onto 16-token router blocks one to one, 32-token engine blocks
onto two router blocks each, SGLang's page size 1 (one token per block) aggregated 16 at
a time. A router block is credited when the engine block that completes it is stored
and withdrawn when any engine block overlapping it is removed, so the router never
credits a block the engine cannot serve.

Keys beyond tokens (`lora_name`, `extra_keys`: adapter, images, salt) are read by the engine
kind's key rule (router/kvevents/event_keys.py) and folded into the router's hashes exactly as
the router hashes a request carrying them (router/contract/block_keys.py). Blocks the router
cannot reproduce are kept as unroutable nodes (so their removals and children are recognised)
but never credited: keys the rule cannot reproduce (a `lora_id` without a name, prompt-embedding
digests, extra keys on engine blocks of another size than the router's), an unknown parent, or
a descendant of any of those. `medium` maps onto tiers (`MEDIUM_TIERS`); an unknown medium is counted and its
event ignored, never guessed. Events of KV cache groups other than 0 (hybrid models'
sliding-window or mamba groups) are counted and ignored: group 0 holds full attention.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from kvroute.router.contract.block_keys import keyed_block_hashes
from kvroute.router.contract.kv_wire import Cleared, Event, Removed, Stored
from kvroute.router.contract.protocol import TIERS, EventType, Tier, block_hashes, u32le
from kvroute.router.kvevents.event_keys import EventKeys, event_keys

MEDIUM_TIERS: dict[str, Tier] = {
    "GPU": "device",
    "CPU": "host",
    "CPU_PINNED": "host",
    "CPU_TIER1": "host",
    "CPU_TIER2": "host",
    "STORAGE": "remote",
    "FS": "remote",
    "OBJ": "remote",
    "DISK": "remote",
}
# refs packs one 16-bit count per tier (saturating): tier t's count is refs & _MASK[t], one copy _UNIT[t]
_UNIT = {tier: 1 << 16 * i for i, tier in enumerate(TIERS)}
_MASK = {tier: 0xFFFF << 16 * i for i, tier in enumerate(TIERS)}
_MAX_UNKNOWN_MEDIA = 16  # distinct unknown names remembered for /router/instances

Op = tuple[EventType, Tier, list[int]]  # (event type, tier, router block hashes)


class _Node:
    __slots__ = ("parent", "base", "fill", "tokens", "covers", "own", "refs", "routable")

    def __init__(self, parent, base: int | None, fill: int, tokens: tuple[int, ...], covers: list[int],
                 routable: bool) -> None:
        self.parent = parent
        self.base = base
        self.fill = fill
        self.tokens = tokens
        self.covers = covers
        self.own = len(covers)
        self.refs = 0
        self.routable = routable


class BlockMap:
    """One instance's engine-hash -> router-hash map; `apply` returns index operations."""

    def __init__(self, seed: int, block_size: int, max_nodes: int = 1 << 20, key_rule: str = "seeded") -> None:
        if block_size < 1:
            raise ValueError(f"router block size must be positive, got {block_size}")
        self.seed = seed
        self.key_rule = key_rule  # router/contract/block_keys.py KEY_RULES: how the engine keys adapters, images, salt
        self.block_size = block_size
        self.max_nodes = max_nodes  # past it the oldest engine blocks go (counted "overflow_evicted")
        self.nodes: dict[int | bytes, _Node] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.unknown_media: dict[str, int] = {}
        self.engine_block_size: int | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def apply(self, event: Event) -> list[Op]:
        if isinstance(event, Stored):
            return self._stored(event)
        if isinstance(event, Removed):
            return self._removed(event)
        if isinstance(event, Cleared):
            self.nodes.clear()
            return [("cleared", "device", [])]
        return []

    # -- BlockStored ----------------------------------------------------------------

    def _stored(self, ev: Stored) -> list[Op]:
        tier = self._tier(ev.medium, ev.group_idx)
        if tier is None:
            return []
        n, bs = len(ev.block_hashes), ev.block_size
        if n == 0 or bs < 1 or len(ev.token_ids) != n * bs:
            self.counts["malformed_stored"] += 1
            return []
        self.engine_block_size = bs
        unit, mask = _UNIT[tier], _MASK[tier]
        new: list[int] = []
        for h, node in self._nodes_for(ev):
            existing = self.nodes.get(h)
            if existing is None:
                self.nodes[h] = existing = node
            elif not existing.routable and node.routable:
                node.refs = existing.refs  # now reproducible (e.g. its parent arrived): take the new view
                self.nodes[h] = existing = node
            elif existing.refs & mask:
                if existing.refs & mask != mask:
                    existing.refs += unit
                continue  # already credited in this tier
            existing.refs += unit
            if existing.routable:
                new.extend(existing.covers[: existing.own])
        ops: list[Op] = [("stored", tier, new)] if new else []
        if len(self.nodes) > self.max_nodes:
            ops.extend(self._evict_oldest())
        return ops

    def _evict_oldest(self) -> list[Op]:
        """An engine that stores more than it can hold: forget its oldest blocks, in every tier."""
        gone: dict[Tier, list[int]] = {}
        nodes = self.nodes
        while len(nodes) > self.max_nodes:
            node = nodes.pop(next(iter(nodes)))
            self.counts["overflow_evicted"] += 1
            if node.routable and node.covers:
                for tier in TIERS:
                    if node.refs & _MASK[tier]:
                        gone.setdefault(tier, []).extend(node.covers)
        return [("removed", tier, hashes) for tier, hashes in gone.items()]

    def _nodes_for(self, ev: Stored) -> Iterator[tuple[int | bytes, _Node]]:
        """(engine hash, a new node for it) for each block of a stored event, in order."""
        keys = event_keys(ev, self.key_rule, self.block_size)
        reason = keys if isinstance(keys, str) else _unroutable_reason(ev, self.nodes)
        if reason is None and not isinstance(keys, str):
            if keys.extras or keys.seed is not None:
                self.counts["keyed"] += len(ev.block_hashes)
            return self._mapped_nodes(ev, keys)
        self.counts[f"unroutable_{reason}"] += len(ev.block_hashes)
        return _unroutable_chain(ev.parent_block_hash, ev.block_hashes)

    def _mapped_nodes(self, ev: Stored, keys: EventKeys) -> Iterator[tuple[int | bytes, _Node]]:
        bs, rbs = ev.block_size, self.block_size
        parent_node = self.nodes.get(ev.parent_block_hash) if ev.parent_block_hash is not None else None
        base = parent_node.base if parent_node else keys.seed
        tail, owners = self._tail(parent_node)
        combined = tail + list(ev.token_ids)
        if keys.extras:  # engine blocks are router blocks here (event_keys checked the sizes)
            hashes = keyed_block_hashes(u32le(combined), rbs, self.seed, keys.extras, parent=base)
        else:
            hashes = block_hashes(combined, rbs, self.seed, parent=base)
        for owner in owners if hashes else ():  # the parent's tail is part of the first router block
            if hashes[0] not in owner.covers:
                owner.covers.append(hashes[0])
        offset, parent = len(tail), ev.parent_block_hash
        for i, h in enumerate(ev.block_hashes):
            if i == keys.routable:  # keys the rule cannot reproduce from here on: so is the rest
                self.counts["unroutable_extra_keys"] += len(ev.block_hashes) - i
                yield from _unroutable_chain(parent, ev.block_hashes[i:])
                return
            start, end = offset + i * bs, offset + (i + 1) * bs
            done = end // rbs  # router blocks complete at this block's end
            fill = end - done * rbs
            first = start // rbs  # the router block holding this block's first token
            # complete router blocks overlapping this block: those it completes (`own`), then the
            # one a later block of this event completes
            covers = hashes[first : min(-(-end // rbs), len(hashes))]
            node_tokens = tuple(combined[end - min(fill, bs) : end]) if fill else ()
            node = _Node(parent, hashes[done - 1] if done else base, fill, node_tokens, covers, True)
            node.own = max(done - first, 0)
            yield h, node
            parent = h

    def _tail(self, node: _Node | None) -> tuple[list[int], list[_Node]]:
        """The `fill` tokens after `node.base` and the nodes holding them (empty for a chain start)."""
        if node is None or not node.fill:
            return [], []
        need, chunks, owners = node.fill, [], []
        while need > 0 and node is not None:
            own = node.tokens[-need:]
            chunks.append(own)
            owners.append(node)
            need -= len(own)
            if need:
                node = self.nodes.get(node.parent) if node.parent is not None else None
        if need > 0:
            raise AssertionError("tail walk ran past the chain")  # guarded by _unroutable_reason
        return [t for chunk in reversed(chunks) for t in chunk], owners

    # -- BlockRemoved -----------------------------------------------------------------

    def _removed(self, ev: Removed) -> list[Op]:
        tier = self._tier(ev.medium, ev.group_idx)
        if tier is None:
            return []
        unit, mask = _UNIT[tier], _MASK[tier]
        gone: list[int] = []
        nodes = self.nodes
        for h in ev.block_hashes:
            node = nodes.get(h)
            if node is None or not node.refs & mask:
                self.counts["unknown_removed"] += 1
                continue
            node.refs -= unit
            if node.refs & mask:
                continue  # another copy still holds it in this tier
            if node.routable:
                gone.extend(node.covers)
            if not node.refs:
                del nodes[h]
        return [("removed", tier, gone)] if gone else []

    def _tier(self, medium: str | None, group_idx: int | None) -> Tier | None:
        if group_idx:
            self.counts["ignored_group"] += 1
            return None
        if medium is None:
            return "device"
        tier = MEDIUM_TIERS.get(medium.upper())
        if tier is None:
            self.counts["unknown_medium"] += 1
            if medium in self.unknown_media or len(self.unknown_media) < _MAX_UNKNOWN_MEDIA:
                self.unknown_media[medium] = self.unknown_media.get(medium, 0) + 1
        return tier


def _unroutable_chain(parent, hashes) -> Iterator[tuple[int | bytes, _Node]]:
    for h in hashes:
        yield h, _Node(parent, None, 0, (), [], False)
        parent = h


def _unroutable_reason(ev: Stored, nodes: dict) -> str | None:
    if ev.parent_block_hash is None:
        return None
    parent = nodes.get(ev.parent_block_hash)
    if parent is None:
        return "unknown_parent"
    if not parent.routable:
        return "unroutable_parent"
    if parent.fill and not _tail_complete(parent, nodes):
        return "unknown_parent"
    return None


def _tail_complete(node: _Node, nodes: dict) -> bool:
    need = node.fill
    while True:
        need -= len(node.tokens)
        if need <= 0:
            return True
        parent = nodes.get(node.parent) if node.parent is not None else None
        if parent is None or not parent.routable:
            return False
        node = parent
