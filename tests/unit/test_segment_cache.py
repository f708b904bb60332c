"""Cached tokenization equals full tokenization (router/contract/segment_cache.py), on many prompts
with adversarial boundaries; tokenizers where reuse would not be exact get no cache."""

import random

import tokenizers

from kvroute.router.contract.segment_cache import SegmentCache
from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|bos|>", "<|eos|>"]
PIECES = ["hello", " world", "  ", "\n", "\n\n", "\t", "naïve", " café", "你好", "🎉", "1234", "'s", " 's", "<|",
          "|>", "<|im_", "im_end|>", "<|im_start", "|", "<", ">", "system", "user", " the", "The", "!!!", "...",
          " \n ", "a" * 40, " " * 33, "-" * 50]


def text(rng, n):
    out = []
    for _ in range(n):
        out.append(rng.choice(SPECIALS) if rng.random() < 0.15 else rng.choice(PIECES))
    return "".join(out)


def full_ids(tok, text_, special=False):
    return tok.backend.encode(text_, add_special_tokens=special).ids


def test_cached_chats_and_completions_equal_full_tokenization():
    tok = load_tokenizer()
    assert tok.segments is not None
    rng = random.Random(0)
    system = "You are a careful assistant. " * 20
    for _ in range(400):
        messages = [{"role": "system", "content": system if rng.random() < 0.7 else text(rng, 30)}]
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": rng.choice(["user", "assistant"]), "content": text(rng, rng.randint(0, 40))})
        rendered = tok.apply_chat_template(messages)
        assert tok.encode_chat(messages) == full_ids(tok, rendered), rendered
        prompt = text(rng, rng.randint(1, 60))
        assert tok.encode(prompt) == full_ids(tok, prompt, special=True), prompt
        assert tok.encode(prompt, add_special_tokens=False) == full_ids(tok, prompt), prompt
    assert tok.segments.hits > 200  # the system prompt and repeated pieces came from the cache


def test_a_repeated_system_prompt_is_encoded_once():
    tok = load_tokenizer(DATA_DIR)  # a fresh instance, with its own cache
    system = {"role": "system", "content": "Long shared instructions. " * 200}
    for i in range(5):
        tok.encode_chat([system, {"role": "user", "content": f"question {i}"}])
    assert tok.segments.misses == 1 and tok.segments.hits == 4


def test_the_cache_holds_at_most_its_token_budget():
    tok = load_tokenizer(DATA_DIR)
    cache = SegmentCache(tok.backend, tok.segments.added, max_tokens=2_000)
    rng = random.Random(1)
    for i in range(200):
        piece = f"distinct piece {i} " + text(rng, 20).replace("<|", "")
        assert cache.encode(piece) == full_ids(tok, piece)
    assert cache.cached_tokens <= 2_000


def test_tokenizers_where_pieces_interact_get_no_cache(tmp_path):
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()  # prefixes a space per piece
    (tmp_path / "sp").mkdir()
    backend.save(str(tmp_path / "sp" / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "sp").segments is None
    byte_level = tokenizers.Tokenizer.from_file(str(DATA_DIR / "tokenizer.json"))
    byte_level.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=True)
    (tmp_path / "bl").mkdir()
    byte_level.save(str(tmp_path / "bl" / "tokenizer.json"))
    assert load_tokenizer(tmp_path / "bl").segments is None


def test_encodings_carry_their_bytes_and_a_key_that_names_their_leading_ids():
    from kvroute.router.contract.protocol import u32le

    tok = load_tokenizer(DATA_DIR)
    rng = random.Random(2)
    systems = ["Shared rules for every turn. " * 30, "Other shared rules. " * 40]
    by_key: dict = {}
    for _ in range(300):
        messages = [{"role": "system", "content": rng.choice(systems)},
                    {"role": "user", "content": text(rng, rng.randint(0, 30))}]
        enc = tok.plan_chat(messages).finish()
        assert enc.ids == full_ids(tok, tok.apply_chat_template(messages))
        assert enc.data == u32le(enc.ids)
        lead = tuple(enc.ids[: enc.prefix_tokens])
        assert by_key.setdefault(enc.prefix_key, lead) == lead  # equal keys: equal leading ids
    assert len({k for k in by_key if len(k) > 3}) >= 2  # the system prompts were named


def test_prefix_hashes_equal_full_hashing():
    from kvroute.router.contract.protocol import block_hashes
    from kvroute.router.decision.prefix_hashes import PrefixHashes

    tok = load_tokenizer(DATA_DIR)
    memo = PrefixHashes(max_hashes=400)
    rng = random.Random(3)
    system = "A system prompt long enough to span blocks. " * 25
    for i in range(200):
        messages = [{"role": "system", "content": system if i % 3 else text(rng, 40)},
                    {"role": "user", "content": text(rng, rng.randint(0, 50))}]
        enc = tok.plan_chat(messages).finish()
        for block_size, seed in ((16, 7), (4, 7), (16, 8)):
            assert memo.of(enc, block_size, seed) == block_hashes(enc.ids, block_size, seed)
    assert memo.hits > 100 and memo.held <= 400
