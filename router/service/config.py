"""Router configuration: one frozen dataclass, CLI flags map 1:1 onto its fields."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.connections import ConnectionLimits
from kvroute.router.decision.admission import AdmissionConfig
from kvroute.router.decision.tenants import DEFAULT_TENANT

EVENT_SOURCES = ("poll", "redis")


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    engines: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "kv_aware"
    index: str = "memory"
    redis: str | None = None
    registry: str | None = None  # redis:// URL of the fleet registry: engines join and leave at run time
    events: str = "poll"  # "poll": follow each engine's /kv/events; "redis": the engines' Redis stream
    tokenizer: str | None = None  # local HF dir; None = the built-in tokenizer
    api_key: str | None = None
    admin_key: str | None = None
    max_inflight: int = 0  # per instance; 0 = unlimited
    # Candidates per decision (router/decision/candidates.py): index holders of the first block, recent
    # senders of it (for recent_ttl_s) and the K least loaded; 0 = every routable instance.
    fast_candidates: int = 16
    recent_ttl_s: float = 2.0
    max_retries: int = 2
    health_interval_s: float = 2.0
    eject_after: int = 3
    ejection_s: float = 10.0  # an instance ejected for failed requests stays out this long (doubling)
    readmit_after: int = 2
    load_interval_s: float = 0.1
    index_ttl_s: float = 60.0  # the index forgets an instance no router sharing it has seen this long
    index_timeout_s: float = 0.25  # each Redis index call; then the breaker counts a failure
    index_breaker_failures: int = 3  # consecutive index failures that open the breaker
    index_breaker_cooldown_s: float = 5.0  # routing on load alone before the breaker probes again
    events_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    # Every upstream wait is bounded (router/service/proxy.py): a stream's first chunk, each later chunk,
    # and a whole non-streamed answer (which an engine sends only when it is done).
    first_byte_timeout_s: float = 60.0
    read_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    # Limits checked before the work they bound (router/contract/limits.py); 0 = derived from the
    # engines' advertised context: 8 chars per token, 4 bytes per char, body at least 1 MiB.
    max_body_bytes: int = 0
    max_prompt_chars: int = 0
    tokenize_workers: int = 2  # threads tokenizing long prompts off the event loop
    tokenize_queue: int = 64  # long prompts of one tenant that may wait for them; beyond, 503 + Retry-After
    # shorter prompts are tokenized on the event loop while nothing else is in flight
    # (router/contract/tokenize_pool.py): ~16k tokens, ~10 ms here; 0 = long prompts always in the pool
    tokenize_idle_inline_chars: int = 65536
    seed: int | None = None
    # Prefill/decode disaggregation (used when the cluster has prefill- and decode-role engines):
    # prompts with fewer uncached tokens than this go whole to a decode engine. The second hop and
    # the pull add a near-constant ~2.5 ms to TTFT and ~10 ms to E2E here (kvroute/benchmarks/disagg.py),
    # while a prefill run in place stalls every running decode for its duration: ~15 ms at 256
    # tokens on the built-in model, growing linearly. Below ~256 moving K/V costs more than it saves.
    pd_min_uncached: int = 256
    kv_secret: str | None = None  # signs transfer grants for prefill engines; default $KVROUTE_KV_SECRET
    # Engines we did not write (router/fleet/kinds, router/kvevents): each engine's kind ("KIND" for all, or
    # "URL=KIND"), and vllm-router's "URL=ENDPOINT[,ENDPOINT...]" ZeroMQ KV event and replay sources.
    engine_kinds: tuple[str, ...] = ()
    kv_event_sources: tuple[str, ...] = ()
    kv_event_replay_sources: tuple[str, ...] = ()
    kv_event_block_size: int = 16  # the router's block size for vLLM/SGLang engines (their own may differ)
    kv_event_topic: str = ""  # ZeroMQ topic prefix to subscribe to ("" = all)
    kv_event_replay_timeout_s: float = 2.0
    # Engine blocks a ZeroMQ-fed instance may hold in the router's map when it advertises no capacity;
    # one that does is capped at CAP_FACTOR x its advertised blocks (router/kvevents/follower.py)
    kv_event_max_blocks: int = 1 << 20
    # Connection hygiene (router/contract/connections.py): a request head must arrive within
    # header_timeout_s, each wait for body bytes is bounded by body_timeout_s (408 and close), an idle
    # keep-alive connection closes after idle_timeout_s; a connection reads at most
    # connection_buffer_bytes ahead of its handler, bodies being received hold at most
    # body_buffer_bytes together (503 past it); connections past max_connections_per_peer are
    # refused, and past max_connections (0: the descriptor limit) a new one displaces the connection
    # waiting longest on its client.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    max_connections: int = 0
    max_connections_per_peer: int = 1024
    connection_buffer_bytes: int = 256 << 10
    body_buffer_bytes: int = 64 << 20
    workers: int = 1  # router processes sharing the port (router/service/workers.py)
    # Admission and tenants (docs/admission.md): off while no SLO is set (here, per tenant or per request).
    api_keys: tuple[tuple[str, str], ...] = ()  # (tenant, key) from --api-key [NAME=]KEY
    tenants: str | None = None  # the tenant file (JSON or TOML), reloaded on SIGHUP
    tenant_header: str | None = None  # the header naming the tenant, among the tenant file's
    trust_tenant_header: bool = False  # with API keys too: a gateway in front sets the header (else refused)
    slo_ttft_s: float | None = None
    admission_margin: float = -0.4
    admission_queue: int = 1024
    priority_edges: tuple[int, ...] = (0, 1)
    # With --redis: every router replica and worker admits by the fleet's shared state, synced this
    # often in the background (router/service/fleet_admission.py); 0 = each process admits alone
    admission_sync_s: float = 0.05
    # The endpoint picker (router/service/ext_proc/): Envoy's ext_proc gRPC service on this port, beside the
    # HTTP proxy (None: off; 0: any free port)
    ext_proc_port: int | None = None
    # fallbacks after the choice in x-gateway-destination-endpoint (the GIE protocol's list, tried in order by
    # gateways that implement it); 0: the choice alone, which plain Envoy's ORIGINAL_DST cluster needs
    ext_proc_fallbacks: int = 0

    def __post_init__(self) -> None:
        if not self.engines and not self.registry and not self.admin_key:
            raise ValueError("give --engine URL, --registry redis://..., or --admin-key to add engines "
                             "through the admin API")
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
        if self.fast_candidates < 0 or self.recent_ttl_s <= 0:
            raise ValueError("--fast-candidates must be >= 0 and --recent-ttl-s positive")
        if self.max_inflight < 0 or self.max_retries < 0:
            raise ValueError("--max-inflight and --max-retries must be >= 0")
        if min(self.health_interval_s, self.load_interval_s, self.events_timeout_s, self.connect_timeout_s,
               self.first_byte_timeout_s, self.read_timeout_s, self.request_timeout_s, self.index_ttl_s,
               self.index_timeout_s, self.index_breaker_cooldown_s) <= 0:
            raise ValueError("intervals and timeouts must be positive")
        if self.max_body_bytes < 0 or self.max_prompt_chars < 0:
            raise ValueError("--max-body-bytes and --max-prompt-chars must be >= 0 (0 = from the model's context)")
        if self.tokenize_idle_inline_chars < 0:
            raise ValueError(f"--tokenize-idle-inline-chars must be >= 0, got {self.tokenize_idle_inline_chars}")
        if self.tokenize_workers < 1 or self.tokenize_queue < 1:
            raise ValueError("--tokenize-workers and --tokenize-queue must be >= 1")
        if not 1 <= self.workers <= 64:
            raise ValueError(f"--workers must be between 1 and 64, got {self.workers}")
        if self.index_breaker_failures < 1:
            raise ValueError("--index-breaker-failures must be >= 1")
        if not 0 <= self.admission_sync_s <= 10:
            raise ValueError(f"--admission-sync-s must be between 0 (off) and 10 seconds, got {self.admission_sync_s}")
        if self.ejection_s < 0:
            raise ValueError("--ejection-s must be >= 0")
        if self.eject_after < 1 or self.readmit_after < 1:
            raise ValueError("--eject-after and --readmit-after must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be between 0 and 65535, got {self.port}")
        if self.ext_proc_port is not None and not 0 <= self.ext_proc_port <= 65535:
            raise ValueError(f"--ext-proc-port must be between 0 and 65535, got {self.ext_proc_port}")
        if not 0 <= self.ext_proc_fallbacks <= 16:
            raise ValueError(f"--ext-proc-fallbacks must be between 0 and 16, got {self.ext_proc_fallbacks}")
        self.connection_limits()  # validates the connection flags
        self.admission()  # validates the admission flags
        self.foreign_engines()  # validates --engine-kind and --kv-event-*

    def foreign_engines(self):
        """({engine URL: kind}, {engine URL: ZeroMQ event sources}) from the flags."""
        from kvroute.router.fleet.kinds import parse_kinds
        from kvroute.router.kvevents.sources import parse_sources

        if not 1 <= self.kv_event_block_size <= 1024:
            raise ValueError(f"--kv-event-block-size must be between 1 and 1024, got {self.kv_event_block_size}")
        if self.kv_event_max_blocks < 1:
            raise ValueError(f"--kv-event-max-blocks must be at least 1, got {self.kv_event_max_blocks}")
        if self.kv_event_replay_timeout_s <= 0:
            raise ValueError("--kv-event-replay-timeout-s must be positive")
        return (parse_kinds(self.engine_kinds, self.engines),
                parse_sources(self.kv_event_sources, self.kv_event_replay_sources, self.engines))

    def tenant_keys(self) -> tuple[tuple[str, str], ...]:
        """(tenant, key) of every --api-key (a plain key is the default tenant's)."""
        return self.api_keys or (((DEFAULT_TENANT, self.api_key),) if self.api_key else ())

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(slo_ttft_s=self.slo_ttft_s, margin=self.admission_margin,
                               max_queue=self.admission_queue, priority_edges=self.priority_edges)

    @property
    def shared_admission(self) -> bool:
        """Admission state shared with the other router replicas and workers through Redis."""
        return bool(self.redis) and self.admission_sync_s > 0

    def connection_limits(self) -> ConnectionLimits:
        limits = ConnectionLimits(header_timeout_s=self.header_timeout_s, body_timeout_s=self.body_timeout_s,
                                  idle_timeout_s=self.idle_timeout_s, max_connections=self.max_connections,
                                  max_connections_per_peer=self.max_connections_per_peer,
                                  connection_buffer_bytes=self.connection_buffer_bytes,
                                  body_buffer_bytes=self.body_buffer_bytes)
        if self.max_body_bytes > self.body_buffer_bytes:
            raise ValueError(f"--max-body-bytes ({self.max_body_bytes}) must not exceed --body-buffer-bytes "
                             f"({self.body_buffer_bytes}): a body that large could never be received")
        return limits
