"""Engine Prometheus metrics: vLLM's names where the meaning is the same, kvroute_engine_* otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)


class EngineMetrics:
    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, {"model_name": model}

        def gauge(name, doc):
            return Gauge(name, doc, list(labels), registry=r).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        def histogram(name, doc):
            return Histogram(name, doc, list(labels), buckets=LATENCY_BUCKETS, registry=r).labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens received.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted (recomputed later).")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between generated tokens.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.")
        self.step_seconds = histogram("kvroute_engine_step_seconds", "Model step duration.")
        self.steps = counter("kvroute_engine_steps", "Model steps run.")
        self.step_tokens = counter("kvroute_engine_step_tokens", "Tokens computed in model steps.")
        self.aborted = counter("kvroute_engine_aborted_requests", "Requests aborted (client gone or stop string).")
        self.kv_events = Counter("kvroute_engine_kv_events", "KV events emitted, by type.", ["type"], registry=r)
        self.rejected = Counter("kvroute_engine_rejected_requests", "Requests rejected, by reason.", ["reason"],
                                registry=r)
        self.kv_pull_bytes = counter("kvroute_engine_kv_pull_bytes", "K/V bytes pulled from prefill engines.")
        self.kv_pull_blocks = counter("kvroute_engine_kv_pull_blocks", "Blocks pulled from prefill engines.")
        self.kv_pull_skipped = counter("kvroute_engine_kv_pull_skipped_blocks",
                                       "Blocks not pulled because the local prefix cache had them.")
        self.kv_pull_seconds = histogram("kvroute_engine_kv_pull_seconds", "Duration of one KV pull.")
        self.kv_pull_failures = Counter("kvroute_engine_kv_pull_failures",
                                        "KV pulls that failed (the blocks were then computed here).", ["reason"],
                                        registry=r)
        self.kv_pinned = gauge("kvroute_engine_kv_pinned_requests", "Prefilled requests whose blocks await a pull.")
        self.kv_pins_expired = counter("kvroute_engine_kv_pins_expired", "Pinned blocks freed by TTL, unpulled.")
        self._seen_queries = self._seen_hits = self._seen_preemptions = 0

    def observe_step(self, seconds: float, tokens: int) -> None:
        self.step_seconds.observe(seconds)
        self.steps.inc()
        self.step_tokens.inc(tokens)

    def observe_state(self, engine: "LLMEngine") -> None:
        bm, sched = engine.block_manager, engine.scheduler
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.kv_usage.set(bm.num_used / bm.num_blocks)
        self.prefix_queries.inc(bm.num_queried_tokens - self._seen_queries)
        self.prefix_hits.inc(bm.num_hit_tokens - self._seen_hits)
        self.preemptions.inc(sched.num_preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = bm.num_queried_tokens, bm.num_hit_tokens
        self._seen_preemptions = sched.num_preemptions
