"""Router-side token ids equal the engine's, for completions and chat (BOS, generation prompt).

Engine side is what vLLM and SGLang compute (Hugging Face transformers: `tokenizer(prompt)`
for completions, `apply_chat_template(..., add_generation_prompt=True, tokenize=True)` for
chat) and what a kvroute engine started with `--model DIR` computes (its /tokenize), on
the built-in tokenizer and on a saved Llama-style tokenizer directory.
"""

import asyncio
import json
import shutil

import pytest

from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer

transformers = pytest.importorskip("transformers")

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' }}{% if loop.first and system %}{{ '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}"
    "{% endif %}{{ message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}"
)
PROMPTS = ["Hello, world!", "  leading spaces and\ttabs\n", "naïve café 你好 🎉", "[INST] looks special [/INST]"]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again, in French?"}],
]


def llama_dir(path):
    """A Llama-2-style directory saved by transformers: BOS added to prompts, template writes bos_token."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_file(str(DATA_DIR / "tokenizer.json"))
    backend.add_special_tokens(["<s>", "</s>"])
    hf = transformers.LlamaTokenizer(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                     add_bos_token=True, add_eos_token=False)
    hf.chat_template = LLAMA2_TEMPLATE
    hf.save_pretrained(str(path))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"  # what transformers itself asks for a byte-level BPE
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    transformers.LlamaConfig(vocab_size=8194, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                             bos_token_id=8192, eos_token_id=8193,
                             architectures=["LlamaForCausalLM"]).save_pretrained(str(path))
    return path


def builtin_dir(path):
    shutil.copytree(DATA_DIR, path)
    transformers.LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                             bos_token_id=1, eos_token_id=2,
                             architectures=["LlamaForCausalLM"]).save_pretrained(str(path))
    return path


@pytest.fixture(params=["builtin", "llama"])
def model_dir(request, tmp_path):
    return (builtin_dir if request.param == "builtin" else llama_dir)(tmp_path / request.param)


def test_router_ids_equal_hugging_face_ids(model_dir):
    ours, hf = load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))
    for prompt in PROMPTS:
        assert ours.encode(prompt) == hf(prompt)["input_ids"]
    for chat in CHATS:
        theirs = hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ours.encode_chat(chat) == theirs
    if model_dir.name == "llama":
        bos = hf.bos_token_id
        assert ours.encode("x")[0] == bos and ours.encode_chat(CHATS[1]).count(bos) == 2  # one per [INST]


async def test_router_ids_equal_a_kvroute_engines(model_dir, start_engine, http):
    url, _ = await start_engine(model=str(model_dir))
    ours = load_tokenizer(model_dir)
    for body, expected in [({"prompt": p}, ours.encode(p)) for p in PROMPTS] + \
                          [({"messages": c}, ours.encode_chat(c)) for c in CHATS]:
        async with http.post(url + "/tokenize", json=body) as r:
            assert (await r.json())["tokens"] == expected


async def test_router_predicts_the_engines_cached_tokens_for_chat(model_dir, start_engine, start_router, http):
    """--tokenizer DIR in front of an engine started with --model DIR, fed by ZeroMQ events only."""
    url, _ = await start_engine(model=str(model_dir), kv_events_zmq="tcp://127.0.0.1:0",
                                kv_events_replay="tcp://127.0.0.1:0")
    async with http.get(url + "/kv/info") as r:
        info = await r.json()
    router, _ = await start_router([url], tokenizer=str(model_dir), engine_kinds=("kvroute",),
                                   kv_event_sources=(f"{url}={info['kv_events_zmq']}",),
                                   kv_event_replay_sources=(f"{url}={info['kv_events_replay']}",))
    chat = CHATS[1] * 6  # long enough for several blocks
    body = {"model": model_dir.name, "messages": chat, "max_tokens": 1}
    async with http.post(router + "/v1/chat/completions", json=body) as r:
        first = await r.json()
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens == len(load_tokenizer(model_dir).encode_chat(chat))
    for _ in range(100):
        async with http.post(router + "/router/explain", json=body) as r:
            predicted = (await r.json())["predicted_cached_tokens"]
        if predicted:
            break
        await asyncio.sleep(0.02)
    async with http.post(router + "/v1/chat/completions", json=body) as r:
        second = await r.json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert predicted == cached == (prompt_tokens - 1) // 16 * 16
