"""Router configuration: one frozen dataclass, CLI flags map 1:1 onto its fields."""

from __future__ import annotations

import dataclasses

EVENT_SOURCES = ("poll", "redis")


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    engines: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "kv_aware"
    index: str = "memory"
    redis: str | None = None
    events: str = "poll"  # "poll": follow each engine's /kv/events; "redis": the engines' Redis stream
    tokenizer: str | None = None  # local HF dir; None = the built-in tokenizer
    api_key: str | None = None
    admin_key: str | None = None
    max_inflight: int = 0  # per instance; 0 = unlimited
    max_retries: int = 2
    health_interval_s: float = 2.0
    eject_after: int = 3
    readmit_after: int = 2
    load_interval_s: float = 0.1
    clear_grace_s: float = 10.0
    events_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    seed: int | None = None
    # Prefill/decode disaggregation (used when the cluster has prefill- and decode-role engines):
    # prompts with fewer uncached tokens than this go whole to a decode engine. The second hop and
    # the pull add a near-constant ~2.5 ms to TTFT and ~10 ms to E2E here (tools/bench_disagg.py),
    # while a prefill run in place stalls every running decode for its duration: ~15 ms at 256
    # tokens on the built-in model, growing linearly. Below ~256 moving K/V costs more than it saves.
    pd_min_uncached: int = 256
    # Engines we did not write (router/kinds, router/kvevents): each engine's kind ("KIND" for all, or
    # "URL=KIND"), and vllm-router's "URL=ENDPOINT[,ENDPOINT...]" ZeroMQ KV event and replay sources.
    engine_kinds: tuple[str, ...] = ()
    kv_event_sources: tuple[str, ...] = ()
    kv_event_replay_sources: tuple[str, ...] = ()
    kv_event_block_size: int = 16  # the router's block size for vLLM/SGLang engines (their own may differ)
    kv_event_topic: str = ""  # ZeroMQ topic prefix to subscribe to ("" = all)
    kv_event_replay_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError("give at least one --engine URL")
        for url in self.engines:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--engine must be an http(s) URL, got {url!r}")
        if len(set(self.engines)) != len(self.engines):
            raise ValueError("the same --engine URL is given twice")
        if self.events not in EVENT_SOURCES:
            raise ValueError(f"--events must be one of {', '.join(EVENT_SOURCES)}, got {self.events!r}")
        if (self.index == "redis" or self.events == "redis") and not self.redis:
            raise ValueError("--index redis and --events redis need --redis URL")
        if self.pd_min_uncached < 0:
            raise ValueError("--pd-min-uncached must be >= 0")
        if self.max_inflight < 0 or self.max_retries < 0:
            raise ValueError("--max-inflight and --max-retries must be >= 0")
        if min(self.health_interval_s, self.load_interval_s, self.events_timeout_s) <= 0:
            raise ValueError("intervals and timeouts must be positive")
        if self.eject_after < 1 or self.readmit_after < 1:
            raise ValueError("--eject-after and --readmit-after must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be between 0 and 65535, got {self.port}")
        self.foreign_engines()  # validates --engine-kind and --kv-event-*

    def foreign_engines(self):
        """({engine URL: kind}, {engine URL: ZeroMQ event sources}) from the flags."""
        from router.kinds import parse_kinds
        from router.kvevents.sources import parse_sources

        if not 1 <= self.kv_event_block_size <= 1024:
            raise ValueError(f"--kv-event-block-size must be between 1 and 1024, got {self.kv_event_block_size}")
        if self.kv_event_replay_timeout_s <= 0:
            raise ValueError("--kv-event-replay-timeout-s must be positive")
        return (parse_kinds(self.engine_kinds, self.engines),
                parse_sources(self.kv_event_sources, self.kv_event_replay_sources, self.engines))
