"""Engine Prometheus metrics: vLLM's names where the meaning is the same, kvroute_engine_* otherwise.

vLLM metrics carry the label `model_name` and use vLLM V1's buckets, so a vLLM dashboard
works unchanged. Per-request phases, as vLLM defines them:

    queue    arrival -> first scheduled          vllm:request_queue_time_seconds
    prefill  first scheduled -> first token      vllm:request_prefill_time_seconds
    decode   first token -> last token           vllm:request_decode_time_seconds
    inference  first scheduled -> last token     vllm:request_inference_time_seconds
    e2e      arrival -> finished                 vllm:e2e_request_latency_seconds

`vllm:time_per_output_token_seconds` and `vllm:inter_token_latency_seconds` both observe
every gap between two tokens of one request (vLLM renamed the first to the second; both
are served). No `*_created` series are exported (they double the series count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvroute.router.contract.metric_buckets import (
    ITERATION_TOKEN_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    STEP_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    buckets_1_2_5,
)

if TYPE_CHECKING:
    from kvroute.engine.core.engine_core import EngineCore
    from kvroute.engine.core.sequence import Sequence

FINISH_REASONS = ("stop", "length", "abort")


class EngineMetrics:
    def __init__(self, model: str, registry: CollectorRegistry | None = None, max_model_len: int = 4096) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, {"model_name": model}

        def gauge(name, doc):
            return Gauge(name, doc, list(labels), registry=r).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        def histogram(name, doc, buckets=STEP_BUCKETS):
            return Histogram(name, doc, list(labels), buckets=buckets, registry=r).labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens received.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted (recomputed later).")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
                             TPOT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Time per output token: each gap between two tokens of a request.", TPOT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Time a request waited to be scheduled.",
                                    REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Time from first scheduled to the first token.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Time from the first token to the last.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Time from first scheduled to the last token.", REQUEST_LATENCY_BUCKETS)
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens of finished requests.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Generated tokens of finished requests.", token_buckets)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Tokens computed per engine step.",
                                          ITERATION_TOKEN_BUCKETS)
        success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                          [*labels, "finished_reason"], registry=r)
        self.request_success = {reason: success.labels(model, reason) for reason in FINISH_REASONS}
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
        self.adapter_loads = counter("kvroute_engine_adapter_loads",
                                     "LoRA adapters loaded into a device slot (a slot refilled: --max-loras).")
        self._seen_queries = self._seen_hits = self._seen_preemptions = self._seen_loads = 0

    def observe_step(self, seconds: float, tokens: int) -> None:
        self.step_seconds.observe(seconds)
        self.steps.inc()
        self.step_tokens.inc(tokens)
        self.iteration_tokens.observe(tokens)

    def observe_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.tpot.observe(seconds)

    def observe_finished(self, seq: Sequence, now: float) -> None:
        """Per-request histograms of a sequence that left the engine (finished, aborted or failed)."""
        reason = seq.finish_reason if seq.finish_reason in self.request_success else "abort"
        self.request_success[reason].inc()
        self.e2e.observe(now - seq.arrival)
        self.request_prompt_tokens.observe(seq.num_prompt)
        self.request_generation_tokens.observe(seq.num_generated)
        scheduled, first, last = seq.scheduled_time, seq.first_token_time, seq.last_token_time
        if scheduled is not None:
            self.queue_time.observe(max(0.0, scheduled - seq.arrival))
        if first is not None:
            start = seq.arrival if scheduled is None else scheduled  # a remote prefill: no prefill here
            self.prefill_time.observe(max(0.0, first - start))
            self.decode_time.observe(max(0.0, last - first))
            self.inference_time.observe(max(0.0, last - start))

    def observe_state(self, core: EngineCore) -> None:
        bm, sched = core.block_manager, core.scheduler
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.kv_usage.set(bm.num_used / bm.num_blocks)
        self.prefix_queries.inc(bm.num_queried_tokens - self._seen_queries)
        self.prefix_hits.inc(bm.num_hit_tokens - self._seen_hits)
        self.preemptions.inc(sched.num_preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = bm.num_queried_tokens, bm.num_hit_tokens
        self._seen_preemptions = sched.num_preemptions
        if sched.adapters is not None:
            self.adapter_loads.inc(sched.adapters.loads - self._seen_loads)
            self._seen_loads = sched.adapters.loads
