"""Events with adapters, images and salts are credited under the engine kind's key rule.

The events are the ones vLLM would publish for the parity fixtures' requests
(tests/unit/data/vllm_keys.json, written by vLLM's own code): split in two events that chain,
engine hashes as vLLM sent them.
"""

import pytest

from kvroute.router.contract.block_keys import KEY_RULES, RequestKeys
from kvroute.router.contract.kv_wire import Removed, Stored
from kvroute.router.contract.protocol import block_hashes, hash_seed, u32le
from kvroute.router.index.memory import MemoryIndex
from kvroute.router.kvevents.translate import BlockMap
from tests.support.vllm_keys import CASES, request_keys

SEED = hash_seed("m")


def vllm_events(case, lora_name=True):
    """The case's blocks as two BlockStored events (the first two blocks, then the rest)."""
    bs, hashes, tokens = case["block_size"], case["vllm"]["block_hashes"], case["token_ids"]
    extras = case["vllm"]["event_extra_keys"]
    name = case["adapter"] if lora_name else None
    lora_id = 1 if case["adapter"] else None
    cut = 2
    first = Stored(hashes[:cut], None, tokens[:cut * bs], bs, lora_id, "GPU", name,
                   extras[:cut] if extras else None)
    rest = Stored(hashes[cut:], hashes[cut - 1], tokens[cut * bs:len(hashes) * bs], bs, lora_id, "GPU", name,
                  extras[cut:] if extras else None)
    return first, rest


def fed(*events, rule="vllm"):
    bmap, index = BlockMap(SEED, 16, key_rule=rule), MemoryIndex()
    for ev in events:
        for kind, tier, hashes in bmap.apply(ev):
            index.apply_sync("e1", kind, hashes, tier)
    return bmap, index


def cached(index, case, keys: RequestKeys, rule="vllm"):
    hashes = KEY_RULES[rule].request_hashes(u32le(case["token_ids"]), 16, "m", keys)
    match = index.lookup_sync(hashes).get("e1")
    return match.by_tier.get("device", 0) if match else 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_vllm_events_are_credited_to_the_request_that_made_them(name):
    case = CASES[name]
    bmap, index = fed(*vllm_events(case))
    assert cached(index, case, request_keys(case)) == len(case["vllm"]["block_hashes"])
    assert not [k for k in bmap.counts if k.startswith("unroutable")]


def test_an_adapters_blocks_are_not_credited_to_another_adapter_or_the_base_model():
    sql = CASES["adapter_sql"]
    _, index = fed(*vllm_events(sql))
    assert cached(index, sql, RequestKeys(adapter="sql")) == 4
    assert cached(index, sql, RequestKeys(adapter="chat")) == 0
    assert cached(index, sql, RequestKeys()) == 0
    assert cached(index, sql, RequestKeys(adapter="sql", salt="x")) == 0


def test_an_image_matches_only_the_same_image_and_the_text_before_it_is_shared():
    one = CASES["one_image"]
    _, index = fed(*vllm_events(one))
    keys = request_keys(one)
    assert cached(index, one, keys) == 4
    other = RequestKeys(images=(keys.images[0].__class__(hash="0" * 64, offset=5, length=20),))
    assert cached(index, one, other) == 0  # the image starts in block 0: nothing is shared


def test_a_lora_name_without_extra_keys_is_keyed_as_vllm_keys_it_and_a_bare_lora_id_is_not():
    sql = CASES["adapter_sql"]
    a, b = vllm_events(sql)
    bare = [Stored(e.block_hashes, e.parent_block_hash, e.token_ids, 16, e.lora_id, "GPU", e.lora_name, None)
            for e in (a, b)]
    _, index = fed(*bare)
    assert cached(index, sql, RequestKeys(adapter="sql")) == 4
    nameless = [Stored(e.block_hashes, e.parent_block_hash, e.token_ids, 16, 7, "GPU", None, None) for e in (a, b)]
    bmap, index = fed(*nameless)
    assert index.size_sync() == 0 and bmap.counts["unroutable_lora_without_name"] == 4


def test_removing_a_keyed_block_withdraws_it():
    case = CASES["adapter_two_images_salt"]
    a, b = vllm_events(case)
    bmap, index = fed(a, b)
    for kind, tier, hashes in bmap.apply(Removed([b.block_hashes[0]], "GPU")):
        index.apply_sync("e1", kind, hashes, tier)
    assert cached(index, case, request_keys(case)) == 2


def test_extra_keys_on_engine_blocks_of_another_size_and_prompt_embeds_are_not_credited():
    case = CASES["adapter_sql"]
    tokens = case["token_ids"][:64]
    big = Stored([1, 2], None, tokens, 32, 1, "GPU", "sql", [["sql"], ["sql"]])
    embeds = Stored([3], None, tokens[:16], 16, None, "GPU", None, [[b"\x00" * 32]])
    bmap, index = fed(big, embeds)
    assert index.size_sync() == 0
    assert bmap.counts["unroutable_extra_keys_block_size"] == 2 and bmap.counts["unroutable_prompt_embeds"] == 1


def test_the_seeded_rule_takes_a_kvroute_engines_chain_seed_and_refuses_other_keys():
    tokens = CASES["text"]["token_ids"][:48]
    seed = hash_seed("m", "tenant-a", "sql")
    ev = Stored([11, 12, 13], None, tokens, 16, None, "GPU", "sql", [[["kvroute_hash_seed", seed]], None, None])
    bmap, index = fed(ev, rule="seeded")
    assert index.lookup_sync(block_hashes(tokens, 16, seed))["e1"].by_tier == {"device": 3}
    sglang_lora = Stored([21], None, tokens[:16], 16, 3, "GPU", None, None)
    bmap, index = fed(sglang_lora, rule="seeded")
    assert index.size_sync() == 0 and bmap.counts["unroutable_lora"] == 1
