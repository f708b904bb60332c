"""The engine's /metrics: vLLM's names, meanings and buckets, no *_created series."""

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from kvroute.router.contract.metric_buckets import REQUEST_LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, buckets_1_2_5

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


async def scrape(http, url) -> tuple[str, dict]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def value(samples: dict, name: str, **labels) -> float | None:
    for (n, lbls), v in samples.items():
        if n == name and all(dict(lbls).get(k) == w for k, w in labels.items()):
            return v
    return None


def bucket_bounds(samples: dict, name: str) -> list[float]:
    return sorted(float(dict(lbls)["le"]) for (n, lbls) in samples if n == name + "_bucket"
                  if dict(lbls)["le"] != "+Inf")


def test_1_2_5_buckets_like_vllm():
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)
    assert buckets_1_2_5(4096)[-1] == 2000


async def test_request_phase_histograms_and_success_by_reason(start_engine, http):
    url, _ = await start_engine(time_scale=0.01)
    for _ in range(2):
        async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}) as r:
            assert r.status == 200
    async with http.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as r:
        usage = (await r.json())["usage"]
    text, s = await scrape(http, url)
    assert "_created" not in text
    assert value(s, "vllm:request_success_total", finished_reason="length") == 3
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 0
    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:e2e_request_latency_seconds"):
        assert value(s, name + "_count") == 3, name
        assert bucket_bounds(s, name) == list(REQUEST_LATENCY_BUCKETS), name
    assert value(s, "vllm:request_prompt_tokens_count") == 3
    assert value(s, "vllm:request_prompt_tokens_sum") == 3 * usage["prompt_tokens"]
    assert value(s, "vllm:request_generation_tokens_sum") == 3 + 3 + 1
    assert bucket_bounds(s, "vllm:request_prompt_tokens")[:4] == [1, 2, 5, 10]
    # two gaps per 3-token request, none for the 1-token one
    assert value(s, "vllm:time_per_output_token_seconds_count") == 4
    assert value(s, "vllm:inter_token_latency_seconds_count") == 4
    assert bucket_bounds(s, "vllm:time_per_output_token_seconds") == list(TPOT_BUCKETS)
    assert bucket_bounds(s, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    steps = value(s, "kvroute_engine_steps_total")
    assert value(s, "vllm:iteration_tokens_total_count") == steps > 0
    assert value(s, "vllm:iteration_tokens_total_sum") == value(s, "kvroute_engine_step_tokens_total")
    assert value(s, "vllm:request_decode_time_seconds_sum") <= value(s, "vllm:e2e_request_latency_seconds_sum")


async def test_stop_string_counts_as_stop(start_engine, http):
    url, _ = await start_engine(backend="torch")
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    async with http.post(url + "/v1/completions", json=body) as r:
        text = (await r.json())["choices"][0]["text"]
    async with http.post(url + "/v1/completions", json={**body, "stop": [text[4:7]]}) as r:
        assert (await r.json())["choices"][0]["finish_reason"] == "stop"
    for _ in range(100):  # the engine ends the sequence between steps, after the answer went out
        _, s = await scrape(http, url)
        if value(s, "vllm:e2e_request_latency_seconds_count") == 2:
            break
        await asyncio.sleep(0.02)
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(s, "vllm:request_success_total", finished_reason="abort") == 0
