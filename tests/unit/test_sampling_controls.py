"""Logit bias, penalties (vLLM semantics), top-k/min-p and logprobs: unit level and over HTTP."""

import math

import pytest
import torch

from kvroute.engine.core.work import SamplingParams, SeqWork
from kvroute.engine.runners.logits_processors import apply_logit_bias, apply_penalties
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.sampling import sample, top_k_min_p_filter
from kvroute.engine.runners.torch_runner import TorchRunner
from tests.support.sse import sse_events

torch.set_num_threads(1)


def test_penalties_follow_vllm():
    row = torch.tensor([2.0, -2.0, 1.0, 3.0, 0.5])
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    apply_penalties(row, prompt_ids=[1], output_ids=[0, 0, 2], p=p)
    # token 0: 2/2 - 0.5*2 - 0.25; token 1 (prompt only): -2*2; token 2: 1/2 - 0.5 - 0.25; 3, 4 untouched
    assert row.tolist() == pytest.approx([-0.25, -4.0, -0.25, 3.0, 0.5])


def test_logit_bias_adds():
    row = torch.zeros(4)
    apply_logit_bias(row, ((1, 5.0), (3, -100.0)))
    assert row.tolist() == [0.0, 5.0, 0.0, -100.0]


def test_top_k_and_min_p_filters():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert top_k_min_p_filter(probs, 2, 0.0).tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert top_k_min_p_filter(probs, 0, 0.5).tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]])
    assert {sample(logits, [SamplingParams(top_k=1)], [0], gen)[0] for _ in range(20)} == {1}


def test_runner_logprobs_are_the_models_log_softmax():
    ids = tuple(range(100, 140))
    work = SeqWork(0, ids, 0, tuple(range(3)), True, SamplingParams(temperature=0.0, logprobs=5))
    a, b = TorchRunner(ModelConfig.tiny(), 16, 16, seed=3), TorchRunner(ModelConfig.tiny(), 16, 16, seed=3)
    try:
        out = a.execute_sync([work])
        expected = torch.log_softmax(b.forward_logits([work])[0].float(), dim=-1)
    finally:
        a.close(), b.close()
    lp = out.logprobs[0]
    values, top_ids = expected.topk(5)
    assert lp.token_id == out[0] == top_ids[0].item()  # greedy picks the most likely
    assert [t for t, _ in lp.top] == top_ids.tolist()
    assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=1e-5)
    assert lp.logprob == pytest.approx(values[0].item(), abs=1e-5)


PROMPT_IDS = list(range(300, 340))
A, B = 100, 200


async def greedy(http, url, **extra):
    body = {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(A): 50, str(B): 49}, **extra}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def tokens_of(http, url, **extra):
    from kvroute.engine.service.logprob_format import token_text
    from kvroute.router.contract.tokenizer import load_tokenizer

    names = {token_text(load_tokenizer(), t): t for t in (A, B)}
    out = await greedy(http, url, logprobs=0, **extra)
    return [names.get(t) for t in out["choices"][0]["logprobs"]["tokens"]]


async def test_penalties_change_greedy_output_over_http(start_engine, http):
    url, _ = await start_engine(backend="torch")
    assert await tokens_of(http, url) == [A] * 5
    assert await tokens_of(http, url, frequency_penalty=2.0) == [A, B, A, B, A]
    assert await tokens_of(http, url, presence_penalty=2.0) == [A, B, A, A, A]
    assert await tokens_of(http, url, repetition_penalty=1.5) == [A, B, A, A, A]


async def test_completion_and_chat_logprobs_over_http(start_engine, http):
    url, _ = await start_engine(backend="torch")
    out = await greedy(http, url, logprobs=3, logit_bias={})
    lp, text = out["choices"][0]["logprobs"], out["choices"][0]["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == out["usage"]["completion_tokens"] == 5
    assert "".join(lp["tokens"]) == text and lp["text_offset"][0] == 0
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert value <= 0 and top[token] == value == max(top.values()) and len(top) == 3  # greedy: the best
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.8, "seed": 1,
            "logprobs": True, "top_logprobs": 2, "stream": True}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        events = await sse_events(r)
    entries = [e for c in events[:-1] if c["choices"] and c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
    assert len(entries) == 4
    for e in entries:
        assert len(e["top_logprobs"]) == 2 and e["bytes"] == list(e["token"].encode())
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] >= -9999.0
        assert sum(math.exp(t["logprob"]) for t in e["top_logprobs"]) <= 1.0 + 1e-6


async def test_sim_logprobs_are_its_uniform_model(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        content = (await r.json())["choices"][0]["logprobs"]["content"]
    from kvroute.router.contract.tokenizer import load_tokenizer

    expected = -math.log(load_tokenizer().vocab_size - 5)
    assert len(content) == 3 and all(e["logprob"] == pytest.approx(expected) for e in content)
    assert all(e["top_logprobs"][0]["token"] == e["token"] and len(e["top_logprobs"]) == 2 for e in content)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_body_naming_no_sampling_field_gets_what_the_full_checks_give(kind):
    """The shortcut for bodies without sampling fields returns exactly the defaults the full path
    computes (a field named as null takes the full path)."""
    from kvroute.router.contract.openai_sampling import sampling_fields

    assert sampling_fields({"prompt": "hi"}, kind) == sampling_fields({"prompt": "hi", "top_k": None}, kind)
    assert sampling_fields({}, kind) is not sampling_fields({}, kind)  # a fresh dict: callers add to it
