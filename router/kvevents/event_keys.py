"""What a `BlockStored` says about its blocks' keys beyond tokens, read by the engine's key rule.

router/contract/block_keys.py names the rules; here is how each reads an event:

    vllm    `extra_keys` (one entry per block: adapter name, [image hash, offset], salt) are folded
            into the router's hash of each block as they come. An event from a vLLM without
            `extra_keys` that names `lora_name` gets the name on every block, as vLLM keys it; one
            with `lora_id` alone cannot be reproduced (the id is the engine's own number).
            Prompt-embedding digests (bytes) cannot be reproduced from a request either.
    seeded  a kvroute engine puts its chain's seed (model, salt, adapter) in the first block's
            extra keys, `[["kvroute_hash_seed", seed]]` (engine/service/zmq_publisher.py); any
            other extra key, or an adapter without that seed (SGLang's `lora_id`), cannot be
            reproduced.

Extra keys are per engine block: an event with them is routable only when the engine's block
size is the router's (vLLM's 16 beside the router's 16), since a router block of another size
would need keys the engine never computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvroute.router.contract.block_keys import KEY_RULES
from kvroute.router.contract.kv_wire import Stored

SEED_KEY = "kvroute_hash_seed"
ALL_BLOCKS = 1 << 62  # `routable` when every block of the chain is reproducible


class EventKeys:
    """Per-block extra keys (None where a block has none), the chain seed of a first block, and how
    many leading blocks are reproducible (`routable`; the rest of the chain is not)."""

    __slots__ = ("extras", "seed", "routable")

    def __init__(self, extras: list[Any] | None = None, seed: int | None = None, routable: int = ALL_BLOCKS) -> None:
        self.extras = extras
        self.seed = seed
        self.routable = routable


PLAIN = EventKeys()


def event_keys(ev: Stored, rule: str, router_block_size: int) -> EventKeys | str:
    """The event's keys under `rule`, or the reason its blocks cannot be reproduced."""
    return READERS[rule](ev, router_block_size)


def _vllm(ev: Stored, router_block_size: int) -> EventKeys | str:
    extras = ev.extra_keys
    if not isinstance(extras, list) or not any(extras):
        if ev.lora_name:
            extras = [[ev.lora_name]] * len(ev.block_hashes)
        elif ev.lora_id is not None:
            return "lora_without_name"
        else:
            return PLAIN
    if len(extras) != len(ev.block_hashes):
        return "malformed_extra_keys"
    kinds: set[str] = set()
    for entry in extras:
        if entry is not None and not isinstance(entry, (list, tuple)):
            return "malformed_extra_keys"
        kinds.update(_item_kind(item) for item in entry or ())
    if "bad" in kinds:
        return "malformed_extra_keys"
    if "bytes" in kinds:
        return "prompt_embeds"
    if ev.block_size != router_block_size:
        return "extra_keys_block_size"
    return EventKeys(extras=list(extras))


def _seeded(ev: Stored, router_block_size: int) -> EventKeys | str:
    extras = ev.extra_keys or ()
    seed = None
    if extras and extras[0] and ev.parent_block_hash is None:
        first = extras[0]
        if (len(first) == 1 and isinstance(first[0], (list, tuple)) and len(first[0]) == 2
                and first[0][0] == SEED_KEY and isinstance(first[0][1], int) and 0 <= first[0][1] < 1 << 64):
            seed, extras = first[0][1], extras[1:]
    if seed is None and (ev.lora_id is not None or ev.lora_name):
        return "lora"
    skip = 1 if seed is not None else 0
    keyed = next((i + skip for i, e in enumerate(extras) if e), None)  # this block's key has more than tokens
    if keyed == 0:
        return "extra_keys"
    if seed is None and keyed is None:
        return PLAIN
    return EventKeys(seed=seed, routable=keyed if keyed is not None else ALL_BLOCKS)


READERS: dict[str, Callable[[Stored, int], EventKeys | str]] = {"vllm": _vllm, "seeded": _seeded}  # by KEY_RULES' names
if READERS.keys() != KEY_RULES.keys():
    raise ImportError(f"event_keys reads events of {sorted(READERS)}, the key rules are {sorted(KEY_RULES)}")


def _item_kind(item: Any) -> str:
    """An extra key of vLLM's untagged form: a name or salt (str), [image hash, offset], a digest (bytes)."""
    if isinstance(item, str):
        return "str"
    if isinstance(item, (bytes, bytearray)):
        return "bytes"
    if (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], int) and not isinstance(item[1], bool)):
        return "image"
    return "bad"
