"""Minimal vLLM- and SGLang-shaped HTTP servers (the endpoints the router reads), for tests.

They answer /v1/models, /metrics (the engines' metric names), /tokenize, /health,
/get_load and /get_server_info as those engines document them, and /v1/completions with
a fixed answer. Tokens come from a given tokenizer, so a test decides whether the engine
tokenizes like the router.
"""

from __future__ import annotations

from aiohttp import web

VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} {usage}
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="{num_blocks}"}} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{model}"}} 0.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{model}"}} 0.0
"""  # noqa: E501 - the exposition line as vLLM writes it
VLLM_COUNTERS = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} {prompt_tokens}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {generation_tokens}
"""

SGLANG_METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="{model}"}} {running}
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="{model}"}} {waiting}
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="{model}"}} {usage}
"""
# generation_tokens_total counts finished requests only (no progress signal); realtime_tokens_total runs
SGLANG_COUNTERS = """# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="{model}"}} {generation_tokens}
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{{model_name="{model}",mode="prefill_compute"}} {prompt_tokens}
sglang:realtime_tokens_total{{model_name="{model}",mode="decode"}} {realtime_tokens}
"""


class StubEngine:
    """State the stub reports; change it between polls."""

    def __init__(self, kind, tokenizer, model="m", block_size=16, num_blocks=1000, metrics=True, counters=True):
        """`counters`: /metrics has the token counters the router reads as progress."""
        self.kind, self.tokenizer, self.model = kind, tokenizer, model
        self.block_size, self.num_blocks, self.metrics, self.counters = block_size, num_blocks, metrics, counters
        self.running, self.waiting, self.usage = 0, 0, 0.0
        self.prompt_tokens = self.generation_tokens = self.realtime_tokens = 0  # vLLM's; SGLang's realtime decode
        self.completions = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", lambda r: web.Response(text=""))
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions", self.complete)
        if self.metrics:
            app.router.add_get("/metrics", self.prometheus)
        if self.kind == "sglang":
            app.router.add_get("/get_load", self.get_load)
            app.router.add_get("/get_server_info", self.server_info)
        return app

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "max_model_len": 4096, "parent": None},
            {"id": "my-lora", "object": "model", "parent": self.model}]})

    async def prometheus(self, request):
        page = VLLM_METRICS if self.kind == "vllm" else SGLANG_METRICS
        if self.counters:
            page += VLLM_COUNTERS if self.kind == "vllm" else SGLANG_COUNTERS
        return web.Response(text=page.format(model=self.model, running=float(self.running),
                                             waiting=float(self.waiting), usage=self.usage,
                                             block_size=self.block_size, num_blocks=self.num_blocks,
                                             prompt_tokens=float(self.prompt_tokens),
                                             generation_tokens=float(self.generation_tokens),
                                             realtime_tokens=float(self.realtime_tokens)),
                            content_type="text/plain")

    async def tokenize(self, request):
        body = await request.json()
        if "messages" in body:
            ids = self.tokenizer.encode_chat(body["messages"])
        else:
            ids = self.tokenizer.encode(body["prompt"])
        return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})

    async def complete(self, request):
        self.completions += 1
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": self.model,
                                  "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def get_load(self, request):
        return web.json_response([{"dp_rank": 0, "num_reqs": self.running, "num_waiting_reqs": self.waiting,
                                   "num_tokens": 100}])

    async def server_info(self, request):
        return web.json_response({"page_size": self.block_size,
                                  "max_total_num_tokens": self.num_blocks * self.block_size, "model_path": self.model})
