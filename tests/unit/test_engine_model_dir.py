"""`--model DIR`: a Hugging Face Llama checkpoint directory served by the engine."""

import torch

from kvroute.router.contract.tokenizer import load_tokenizer
from tests.support.hf_checkpoint import build_checkpoint


async def test_engine_serves_a_hf_checkpoint_dir(tmp_path, start_engine, http):
    torch.set_num_threads(1)
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    hf = build_checkpoint(model_dir)
    url, _ = await start_engine(backend="torch", model=str(model_dir))
    async with http.get(url + "/kv/info") as r:
        info = await r.json()
    assert info["model"] == "tiny-llama" and info["max_model_len"] == 512 and info["num_kv_heads"] == 2
    assert info["tokenizer"] == load_tokenizer(model_dir).fingerprint
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        out = await r.json()
    assert out["usage"]["completion_tokens"] == 4
    # Greedy tokens equal transformers' own greedy continuation of the same prompt.
    ids = load_tokenizer(model_dir).encode_chat(body["messages"])
    with torch.no_grad():
        expected = hf.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0, len(ids):].tolist()
    async with http.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 4, "temperature": 0,
                                                        "ignore_eos": True}) as r:
        text = (await r.json())["choices"][0]["text"]
    assert text == load_tokenizer(model_dir).decode(expected)
