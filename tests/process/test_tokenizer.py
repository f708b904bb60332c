import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import tokenizers
from tokenizers import processors

from kvroute.router.contract.detokenizer import IncrementalDetokenizer
from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer, validate_messages

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
MULTIBYTE = "naïve café: 你好，世界 — emoji 🎉👍🏽 and 👨‍👩‍👧 ok, Ελληνικά, العربية"
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
HEADER_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def make_llama3_dir(path, *, add_bos_token=None, post_processor=True):
    """A Llama-3-style model dir built from the built-in vocabulary plus header tokens."""
    path.mkdir()
    backend = tokenizers.Tokenizer.from_file(str(DATA_DIR / "tokenizer.json"))
    backend.add_special_tokens(HEADER_TOKENS)
    if post_processor:
        bos_id = backend.token_to_id("<|begin_of_text|>")
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos_id)]
        )
    backend.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": LLAMA3_TEMPLATE}
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    eot = backend.token_to_id("<|eot_id|>")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, 8193]}))
    return path


@pytest.mark.parametrize("text", ["Hello, world! def f(x):\n    return x  # ok", MULTIBYTE, "", " \n\t "])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_builtin_vocab_and_special_tokens(tok):
    assert tok.vocab_size == 8192
    backend = tok.backend
    names = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
    assert [backend.token_to_id(n) for n in names] == [0, 1, 2, 3, 4]
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.stop_token_ids == frozenset({2, 4})
    assert tok.encode("hello")[0] != tok.bos_token_id
    assert tok.name == "kvroute-bpe-8k"


def test_builtin_is_cached_and_compact(tok):
    assert load_tokenizer() is tok
    assert (DATA_DIR / "tokenizer.json").stat().st_size < 1_000_000


def test_imports_neither_torch_nor_transformers():
    code = ("import sys, kvroute.router.contract.tokenizer as t; t.load_tokenizer(); "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_fingerprint_stable_and_template_sensitive(tok, tmp_path):
    again = load_tokenizer(DATA_DIR)
    assert again is not tok
    assert again.fingerprint == tok.fingerprint
    assert len(tok.fingerprint) == 16 and int(tok.fingerprint, 16) >= 0
    copy = tmp_path / "copy"
    shutil.copytree(DATA_DIR, copy)
    assert load_tokenizer(copy).fingerprint == tok.fingerprint
    (copy / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert load_tokenizer(copy).fingerprint != tok.fingerprint


def test_builtin_chat_template(tok):
    expected = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(CONVERSATION) == expected
    ids = tok.encode_chat(CONVERSATION)
    assert ids[0] == 3 and ids.count(3) == 3 and ids.count(4) == 2
    assert tok.decode(ids, skip_special_tokens=False) == expected


def test_list_content_parts_are_joined(tok):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(parts) == "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        None,
        ["hello"],
        [{"content": "no role"}],
        [{"role": "", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
    ],
)
def test_bad_messages_raise(tok, messages):
    with pytest.raises(ValueError):
        validate_messages(messages)
    with pytest.raises(ValueError):
        tok.encode_chat(messages)


def test_incremental_detokenizer_matches_decode(tok):
    ids = tok.encode(MULTIBYTE + " tail")
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == tok.decode(ids)
    assert "" in deltas  # some characters did span several tokens
    assert detok.finish() == ""


def test_incremental_detokenizer_lists_prompt_and_finish(tok):
    prompt = tok.encode("Say: ")
    ids = tok.encode("🎉 done")
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt)
    assert detok.add(ids[:2]) == ""  # the emoji's bytes have not all arrived
    assert detok.add(ids[2:]) == "🎉 done"
    cut = IncrementalDetokenizer(tok)
    assert cut.add(ids[:2]) == ""
    assert cut.finish() == tok.decode(ids[:2])
    assert "\ufffd" in cut.text


def test_no_chat_template(tmp_path):
    d = tmp_path / "plain"
    d.mkdir()
    shutil.copy(DATA_DIR / "tokenizer.json", d / "tokenizer.json")
    plain = load_tokenizer(d)
    assert plain.chat_template is None and plain.name == "plain"
    assert plain.eos_token_id is None and plain.stop_token_ids == frozenset()
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template(CONVERSATION)


def test_hf_dir_llama3_style(tok, tmp_path):
    model = load_tokenizer(make_llama3_dir(tmp_path / "llama3"))
    assert model.vocab_size == 8192 + len(HEADER_TOKENS)
    bos, eot = model.backend.token_to_id("<|begin_of_text|>"), model.backend.token_to_id("<|eot_id|>")
    assert model.bos_token_id == bos and model.eos_token_id == bos + 1
    assert model.stop_token_ids == frozenset({bos + 1, eot, 8193})
    assert model.fingerprint != tok.fingerprint
    text = model.apply_chat_template(CONVERSATION)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = model.encode_chat(CONVERSATION)
    assert ids[0] == bos and ids.count(bos) == 1 and ids.count(eot) == 2
    assert model.encode("hi") == [bos] + tok.encode("hi")  # the post-processor adds BOS
    assert model.encode("hi", add_special_tokens=False) == tok.encode("hi")
    with pytest.raises(ValueError, match="unknown role tool"):
        model.apply_chat_template([{"role": "tool", "content": "x"}])


def test_hf_dir_add_bos_token_flag(tmp_path):
    on = load_tokenizer(make_llama3_dir(tmp_path / "on", add_bos_token=True, post_processor=False))
    off = load_tokenizer(make_llama3_dir(tmp_path / "off", add_bos_token=False))
    bos = on.bos_token_id
    assert on.encode("hi")[0] == bos and off.encode("hi")[0] != bos
    assert on.fingerprint != off.fingerprint
    rendered = on.apply_chat_template(CONVERSATION)
    assert rendered.startswith("<|begin_of_text|>")
    assert on.encode_chat(CONVERSATION) == on.encode(rendered, add_special_tokens=False)  # no second BOS
    assert off.encode_chat(CONVERSATION).count(bos) == 1
    (tmp_path / "on" / "chat_template.jinja").write_text(LLAMA3_TEMPLATE.replace("{{ bos_token }}", ""))
    bare = load_tokenizer(tmp_path / "on")
    assert not bare.apply_chat_template(CONVERSATION).startswith("<|begin_of_text|>")
    assert bare.encode_chat(CONVERSATION) == on.encode_chat(CONVERSATION)[1:]  # as HF and vLLM: the template decides


@pytest.mark.parametrize("path", ["does/not/exist", "tokenizer.json"])
def test_bad_paths(tmp_path, path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError):
        load_tokenizer(tmp_path / path)


def test_dir_without_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    "name,content",
    [("tokenizer.json", "{not json"), ("tokenizer.json", '{"model": 3}'), ("chat_template.jinja", "{% for %}")],
)
def test_corrupt_files(tmp_path, name, content):
    shutil.copytree(DATA_DIR, tmp_path / "m")
    (tmp_path / "m" / name).write_text(content)
    with pytest.raises(ValueError):
        load_tokenizer(tmp_path / "m")


@pytest.mark.parametrize("add_bos_token", [False, True])
def test_transformers_saved_dir(tok, tmp_path, add_bos_token):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DATA_DIR / "tokenizer.json"),
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        add_bos_token=add_bos_token,
    )
    hf.chat_template = LLAMA3_TEMPLATE.replace("<|start_header_id|>", "<|im_start|>")
    hf.save_pretrained(str(tmp_path / "hf"))
    ours = load_tokenizer(tmp_path / "hf")
    for text in ["Hello, world!", MULTIBYTE, "<|im_start|>user\nhi<|im_end|>", ""]:
        assert ours.encode(text) == hf.encode(text)
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        assert ours.decode(ours.encode(text)) == hf.decode(hf.encode(text), skip_special_tokens=True)
    rendered = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CONVERSATION) == rendered
    assert ours.encode_chat(CONVERSATION) == hf.encode(rendered, add_special_tokens=False)
    assert ours.eos_token_id == 2 and 2 in ours.stop_token_ids


def test_incremental_detokenizer_uses_prompt_for_leading_space(tmp_path):
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "▁again": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Metaspace()
    (tmp_path / "sp").mkdir()
    backend.save(str(tmp_path / "sp" / "tokenizer.json"))
    sp = load_tokenizer(tmp_path / "sp")
    assert sp.encode("Hello world") == [1, 2] and sp.decode([1, 2]) == "Hello world"
    after_prompt = IncrementalDetokenizer(sp, prompt_ids=[3, 3, 3, 3, 3, 3, 1])
    assert [after_prompt.add(i) for i in (2, 3)] == [" world", " again"]
    fresh = IncrementalDetokenizer(sp)
    assert [fresh.add(i) for i in (1, 2)] == ["Hello", " world"]
