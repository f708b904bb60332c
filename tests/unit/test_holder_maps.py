"""The memory index's shared holder maps against a plain model: the same lookups, and no map outlives
its last block."""

import random

from kvroute.router.contract.protocol import TIERS
from kvroute.router.index.memory import MemoryIndex


def model_lookup(model: dict[int, dict[str, int]], blocks: list[int]) -> dict[str, dict[str, int]]:
    """Per instance, its consecutive prefix of `blocks` by best tier, block by block."""
    out: dict[str, dict[str, int]] = {}
    alive = set(model.get(blocks[0], {})) if blocks else set()
    for h in blocks:
        holders = model.get(h, {})
        alive &= set(holders)
        if not alive:
            break
        for inst in alive:
            best = next(t for i, t in enumerate(TIERS) if holders[inst] >> i & 1)
            out.setdefault(inst, {}).setdefault(best, 0)
            out[inst][best] += 1
    return out


def test_random_events_match_the_model_and_maps_are_dropped():
    rng = random.Random(7)
    index, model = MemoryIndex(), {}
    chains = [[rng.getrandbits(64) for _ in range(40)] for _ in range(6)]
    instances = [f"e{i}" for i in range(5)]
    for step in range(3000):
        inst, chain = rng.choice(instances), rng.choice(chains)
        tier = rng.choice(TIERS)
        bit = 1 << TIERS.index(tier)
        start = rng.randrange(len(chain))
        blocks = chain[:start + 1] if rng.random() < 0.6 else chain[start:start + rng.randrange(1, 8)]
        kind = rng.random()
        if kind < 0.55:
            index.add_sync(inst, tier, blocks)
            for h in blocks:
                model.setdefault(h, {})[inst] = model.get(h, {}).get(inst, 0) | bit
        elif kind < 0.95:
            index.remove_sync(inst, tier, blocks)
            for h in blocks:
                mask = model.get(h, {}).get(inst, 0) & ~bit
                if mask:
                    model[h][inst] = mask
                elif inst in model.get(h, {}):
                    del model[h][inst]
                    if not model[h]:
                        del model[h]
        else:
            index.clear_sync(inst)
            for h in list(model):
                model[h].pop(inst, None)
                if not model[h]:
                    del model[h]
        if step % 50 == 0:
            for c in chains:
                got = {i: dict(m.by_tier) for i, m in index.lookup_sync(c).items()}
                assert got == model_lookup(model, c)
            assert index.size_sync() == sum(len(v) for v in model.values())
            distinct = {frozenset(v.items()) for v in model.values()}
            assert len(index._maps) == len(distinct)  # one map per distinct holder set, none left over
    for inst in instances:
        index.clear_sync(inst)
    assert index.size_sync() == 0 and len(index._maps) == 0


def test_blocks_held_alike_share_one_map():
    index = MemoryIndex()
    chain = list(range(100, 164))
    for inst in ("a", "b", "c"):
        index.add_sync(inst, "device", chain)
    index.add_sync("c", "host", chain[32:])
    assert len(index._maps) == 2  # {a, b, c: device} and {a, b: device, c: device+host}
    assert {i: dict(m.by_tier) for i, m in index.lookup_sync(chain).items()} == \
        {"a": {"device": 64}, "b": {"device": 64}, "c": {"device": 64}}
    index.remove_sync("c", "device", chain[32:])
    assert dict(index.lookup_sync(chain)["c"].by_tier) == {"device": 32, "host": 32}
