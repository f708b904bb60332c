"""The router keys blocks as vLLM does: fixtures written by vLLM 0.34's own code.

tests/unit/data/vllm_keys.json comes from `python -m kvroute.scripts.vllm_key_fixtures` run where the vLLM
package imports (its hashing modules only; the command is in the tool's docstring): per case the
inputs (token ids, adapter, images with their placeholders, salt) and vLLM's image hashes,
per-block extra keys as `BlockStored.extra_keys` publishes them, and block hashes.
"""

import pytest

from kvroute.router.contract.block_keys import (
    KEY_RULES,
    ImageKey,
    RequestKeys,
    keyed_block_hashes,
    vllm_extra_keys,
)
from kvroute.router.contract.image_keys import image_hash
from kvroute.router.contract.protocol import block_hashes, hash_seed, u32le
from tests.support.vllm_keys import CASES, FIXTURES, request_keys


def _lists(value):
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def test_the_fixtures_cover_text_two_adapters_one_and_two_images_and_a_salt():
    assert FIXTURES["vllm_version"] == "0.34.0"
    assert {"text", "adapter_sql", "adapter_chat", "one_image", "two_images", "salt"} <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_image_hashes_are_vllms(name):
    case = CASES[name]
    assert [image_hash(im["data_uri"], case["model_id"]) for im in case["images"]] == case["vllm"]["image_hashes"]


def test_an_image_hash_depends_on_the_model_and_needs_local_bytes():
    uri = CASES["one_image"]["images"][0]["data_uri"]
    assert image_hash(uri, "another/model") != image_hash(uri, "llava-hf/llava-1.5-7b-hf")
    assert image_hash("https://example.com/cat.png", "m") is None
    assert image_hash("data:image/png;base64,bm90IGFuIGltYWdl", "m") is None  # "not an image"


@pytest.mark.parametrize("name", sorted(CASES))
def test_per_block_extra_keys_are_vllms_event_extra_keys(name):
    case = CASES[name]
    n = len(case["token_ids"]) // case["block_size"]
    ours = vllm_extra_keys(request_keys(case), case["block_size"], n)
    theirs = case["vllm"]["event_extra_keys"] or [None] * n
    assert _lists(ours) == theirs


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_request_hashes_to_what_its_vllm_event_translates_to(name):
    """The router's hashes of the request equal its hashes of the blocks vLLM would publish for it."""
    case = CASES[name]
    bs, model = case["block_size"], "m"
    data = u32le(case["token_ids"])
    extras = case["vllm"]["event_extra_keys"] or []
    from_event = keyed_block_hashes(data, bs, hash_seed(model), extras)
    assert KEY_RULES["vllm"].request_hashes(data, bs, model, request_keys(case)) == from_event
    if name == "text":
        assert from_event == block_hashes(case["token_ids"], bs, hash_seed(model))


def test_blocks_share_a_router_hash_exactly_where_they_share_a_vllm_hash():
    """Same tokens, different keys: per block, equal under vLLM iff equal under the router."""
    names = [n for n in CASES if CASES[n]["token_ids"] == CASES["text"]["token_ids"]]
    assert {"text", "adapter_sql", "adapter_chat", "salt"} <= set(names)
    ours = {n: KEY_RULES["vllm"].request_hashes(u32le(CASES[n]["token_ids"]), 16, "m", request_keys(CASES[n]))
            for n in names}
    for a in names:
        for b in names:
            theirs_equal = [x == y for x, y in zip(CASES[a]["vllm"]["block_hashes"], CASES[b]["vllm"]["block_hashes"])]
            assert [x == y for x, y in zip(ours[a], ours[b])] == theirs_equal, (a, b)


def test_the_seeded_rule_puts_adapter_and_salt_in_the_seed_and_stops_at_the_first_image():
    data = u32le(CASES["text"]["token_ids"])
    rule = KEY_RULES["seeded"]
    plain = rule.request_hashes(data, 16, "m", RequestKeys())
    assert plain == KEY_RULES["vllm"].request_hashes(data, 16, "m", RequestKeys())
    assert hash_seed("m", adapter=None) == hash_seed("m") != hash_seed("m", adapter="sql") != hash_seed("m", "sql")
    assert rule.request_hashes(data, 16, "m", RequestKeys(adapter="sql")) == block_hashes(
        CASES["text"]["token_ids"], 16, hash_seed("m", adapter="sql"))
    imaged = RequestKeys(images=(ImageKey(hash="x", offset=40, length=8),))
    assert rule.request_hashes(data, 16, "m", imaged) == plain[:2]
    assert rule.request_hashes(data, 16, "m", RequestKeys(hashable_tokens=20)) == plain[:1]
