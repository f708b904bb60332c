"""Interned holder maps: which instances hold a block and in which tiers, one object per distinct map.

A holder map ({instance: tier bitmask}) never changes once made, and one object serves every
block that is held alike: a prompt's chain is mostly runs of blocks cached by the same
instances, so the memory index (memory.py) tells where a run ends by identity, one pointer
comparison per block, and N blocks held alike cost one map, not N. A change to a block's
holders moves it to the map that change leads to (made on first use); a map that no block
uses any more is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping


class HolderMap:
    """Immutable: `masks` must not be changed (other blocks share it)."""

    __slots__ = ("masks", "key", "uses")

    def __init__(self, masks: dict[str, int], key: frozenset) -> None:
        self.masks = masks
        self.key = key
        self.uses = 0  # blocks whose holders this is


class HolderMaps:
    def __init__(self) -> None:
        self._maps: dict[frozenset, HolderMap] = {}

    def __len__(self) -> int:
        return len(self._maps)

    def changed(self, old: HolderMap | None, instance: str, mask: int) -> HolderMap | None:
        """The map `old` becomes when `instance`'s mask is `mask` (0: it holds nothing), not yet used
        by anyone (`use` it); None when no instance is left."""
        masks = dict(old.masks) if old is not None else {}
        if mask:
            masks[instance] = mask
        else:
            masks.pop(instance, None)
        return self._intern(masks) if masks else None

    def use(self, new: HolderMap | None, old: HolderMap | None) -> HolderMap | None:
        """One block moved from `old` to `new` (either may be None: no holders); returns the map to
        keep for it (`new`, or the live map equal to it)."""
        if new is not None:
            new = self._maps.setdefault(new.key, new)
            new.uses += 1
        if old is not None:
            old.uses -= 1
            if not old.uses and self._maps.get(old.key) is old:
                del self._maps[old.key]
        return new

    def _intern(self, masks: Mapping[str, int]) -> HolderMap:
        key = frozenset(masks.items())
        found = self._maps.get(key)
        if found is None:
            found = self._maps[key] = HolderMap(dict(masks), key)
        return found
