"""Router configuration, each setting declared once (router/contract/settings.py): `kvroute router`'s
flags, environment variables and the table in docs/router.md are made from these fields."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.connections import ConnectionLimits
from kvroute.router.contract.constraints import HTTP_URL, NOT_NEGATIVE, POSITIVE, Range, at_least
from kvroute.router.contract.limits import RequestLimits
from kvroute.router.contract.settings import check_settings, section, setting
from kvroute.router.decision.admission import AdmissionConfig

EVENT_SOURCES = ("poll", "redis")


def _policies() -> list[str]:
    from kvroute.router.decision.policies import POLICIES

    return sorted(POLICIES)


def _ext_proc_servers() -> list[str]:
    from kvroute.router.service.ext_proc.servers import SERVERS  # names only: no grpc, no protos

    return list(SERVERS)


def _indexes() -> list[str]:
    from kvroute.router.index import INDEXES

    return sorted(INDEXES)


def _seconds(default: float, help: str, **kw) -> float:
    return setting(default, help, check=POSITIVE, **kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterConfig:
    """router"""

    engines: tuple[str, ...] = setting((), "engine base URL (repeat for each engine)", flag="engine", metavar="URL",
                                       check=HTTP_URL)
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0: all interfaces)")
    port: int = setting(8000, "port to listen on", check=Range(0, 65535))
    policy: str = setting("kv_aware", "routing policy", choices=_policies)
    index: str = setting("memory", "where the block -> instance index lives (redis: shared by router replicas)",
                         choices=_indexes)
    redis: str | None = setting(None, "Redis URL for --index redis and/or --events redis")
    registry: str | None = setting(None, "follow this Redis fleet registry (redis://...): engines join and leave at "
                                         "run time")
    events: str = setting("poll", "poll each engine's /kv/events, or read the engines' Redis stream",
                          choices=EVENT_SOURCES)
    tokenizer: str | None = setting(None, "local HF model dir, for --model DIR engines",
                                    default_text="the built-in tokenizer")
    api_key: tuple[str, ...] = setting((), "require 'Authorization: Bearer KEY' on /v1/*; NAME=KEY makes the key "
                                           "tenant NAME's (repeat for each key)", metavar="[NAME=]KEY")
    tenants: str | None = setting(None, "tenant file (JSON or TOML: weight, slo_ttft_s, rate, burst, max_concurrency, "
                                        "keys, allow_request_slo, min_priority); reloaded on SIGHUP and POST "
                                        "/admin/tenants/reload (docs/admission.md)", metavar="FILE")
    tenant_header: str | None = setting(None, "the request header that names the tenant, among those of --tenants "
                                              "FILE (any other value: the default tenant); refused beside API keys "
                                              "without --trust-tenant-header", metavar="NAME")
    trust_tenant_header: bool = setting(False, "with API keys and --tenant-header: a gateway in front sets the header "
                                               "(and drops the clients' own), so it may name the tenant instead of "
                                               "the key")
    admission: AdmissionConfig = section(AdmissionConfig)
    # With --redis: every router replica and worker admits by the fleet's shared state, synced this often in the
    # background (router/service/fleet_admission.py)
    admission_sync_s: float = setting(0.05, "with --redis: router replicas and workers share admission (tenants' "
                                            "limits, weighted shares, fair-queue virtual time, instances' router-side "
                                            "load), synced this often in the background; 0: each process admits alone "
                                            "(docs/admission.md)", check=Range(0, 10))
    admin_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /router/* and /workers; also the "
                                          "key the router and `kvroute planner` use for engines' /admin/*",
                                    env=("KVROUTE_ADMIN_KEY",))
    max_inflight: int = setting(0, "requests in flight per instance; beyond it requests get 429 (0 = unlimited)",
                                check=NOT_NEGATIVE)
    # Candidates per decision (router/decision/candidates.py): index holders of the first block, recent
    # senders of it (for recent_ttl_s) and the K least loaded; 0 = every routable instance.
    fast_candidates: int = setting(16, "K > 0: a decision scores the first block's holders, recent senders of it and "
                                       "the K least loaded instances only (0: every instance)", check=NOT_NEGATIVE)
    recent_ttl_s: float = _seconds(2.0, "with --fast-candidates: how long an instance sent a prefix stays its "
                                        "candidate")
    max_retries: int = setting(2, "retries on another instance before the first byte", check=NOT_NEGATIVE)
    health_interval_s: float = _seconds(2.0, "seconds between health checks of each engine")
    eject_after: int = setting(3, "consecutive failed checks (or failed requests) that eject an engine",
                               check=at_least(1))
    ejection_s: float = setting(10.0, "seconds an instance ejected for failed requests stays out (doubles per "
                                      "ejection)", check=NOT_NEGATIVE)
    readmit_after: int = setting(2, "consecutive good checks that readmit an ejected engine", check=at_least(1))
    load_interval_s: float = _seconds(0.1, "seconds between polls of each engine's /load")
    index_ttl_s: float = _seconds(60.0, "the index forgets an instance that no router sharing it has seen for this "
                                        "long")
    index_timeout_s: float = _seconds(0.25, "timeout of each Redis index call; then the breaker counts a failure")
    index_breaker_failures: int = setting(3, "consecutive index failures after which the router routes on load alone "
                                             "for a cool-down", check=at_least(1))
    index_breaker_cooldown_s: float = _seconds(5.0, "seconds the index breaker stays open before it probes Redis again")
    events_timeout_s: float = _seconds(2.0, "seconds each /kv/events long poll waits for news")
    connect_timeout_s: float = _seconds(2.0, "seconds to open a connection to an engine")
    # Every upstream wait is bounded (router/service/proxy.py): a stream's first chunk, each later chunk,
    # and a whole non-streamed answer (which an engine sends only when it is done).
    first_byte_timeout_s: float = _seconds(60.0, "streams: seconds to wait for an engine's first chunk before "
                                                 "retrying elsewhere")
    read_timeout_s: float = _seconds(30.0, "streams: seconds allowed between two chunks from an engine")
    request_timeout_s: float = _seconds(600.0, "non-streamed requests: seconds to wait for the whole answer")
    limits: RequestLimits = section(RequestLimits)  # checked before the work they bound
    # ~16k tokens, ~10 ms here (router/contract/tokenize_pool.py)
    tokenize_idle_inline_chars: int = setting(65536, "prompts shorter than this are tokenized on the event loop while "
                                                     "no other request is in flight (no thread hop); 0 = long prompts "
                                                     "always go to the tokenizer threads", check=NOT_NEGATIVE)
    # The second hop and the pull add a near-constant ~2.5 ms to TTFT and ~10 ms to E2E here
    # (kvroute/benchmarks/disagg.py), while a prefill run in place stalls every running decode for its duration:
    # ~15 ms at 256 tokens on the built-in model, growing linearly. Below ~256 moving K/V costs more than it saves.
    pd_min_uncached: int = setting(256, "with prefill and decode engines: prompts with fewer uncached tokens skip the "
                                        "prefill stage", check=NOT_NEGATIVE)
    kv_secret: str | None = setting(None, "shared secret signing prefill/decode transfer grants",
                                    env=("KVROUTE_KV_SECRET",))
    # Engines we did not write (router/fleet/kinds, router/kvevents), in vllm-router's forms.
    engine_kinds: tuple[str, ...] = setting((), "kvroute, vllm, sglang or auto; KIND alone sets every engine's",
                                            flag="engine-kind", metavar="[URL=]KIND", default_text="auto (detect)")
    kv_event_sources: tuple[str, ...] = setting((), "an engine's ZeroMQ KV event publisher (vLLM format)",
                                                flag="kv-event-source", metavar="URL=ENDPOINT[,ENDPOINT...]")
    kv_event_replay_sources: tuple[str, ...] = setting((), "its replay socket, asked for batches missed in a gap",
                                                       flag="kv-event-replay-source",
                                                       metavar="URL=ENDPOINT[,ENDPOINT...]")
    kv_event_block_size: int = setting(16, "the router's block size for vLLM/SGLang engines (engine block sizes are "
                                           "mapped)", check=Range(1, 1024))
    kv_event_topic: str = setting("", "ZeroMQ topic prefix", default_text="'': all")
    kv_event_replay_timeout_s: float = _seconds(2.0, "seconds to wait for a replay before rebuilding an instance from "
                                                     "new events")
    connections: ConnectionLimits = section(ConnectionLimits)
    # one that advertises a capacity is capped at CAP_FACTOR x its blocks (router/kvevents/follower.py)
    kv_event_max_blocks: int = setting(1 << 20, "engine blocks kept per ZeroMQ-fed instance that advertises no "
                                                "capacity (else 4x its own)", check=at_least(1))
    workers: int = setting(1, "router processes on one port (SO_REUSEPORT), for more than one core; each keeps its "
                              "own index (or shares --index redis) fed by the same events", check=Range(1, 64))
    # The endpoint picker (router/service/ext_proc/): Envoy's ext_proc gRPC service beside the HTTP proxy
    ext_proc_port: int | None = setting(None, "also serve Envoy's ext_proc gRPC service on PORT: kvroute as the "
                                              "endpoint picker of a gateway (the Gateway API Inference Extension; "
                                              "docs/gateway.md); needs kvroute[gateway]", check=Range(0, 65535),
                                        metavar="PORT", default_text="off")
    ext_proc_server: str = setting("lean", "the endpoint picker's gRPC server: lean (HTTP/2 on the router's "
                                           "event loop) or grpcio (grpcio's asyncio server, the fallback)",
                                   choices=_ext_proc_servers)
    # the GIE protocol's list, tried in order by gateways that implement it
    ext_proc_fallbacks: int = setting(0, "next-best endpoints after the choice in x-gateway-destination-endpoint, for "
                                         "gateways that try the list in order (0: the choice alone, as plain Envoy's "
                                         "ORIGINAL_DST cluster needs)", check=Range(0, 16), metavar="N")
    seed: int | None = setting(None, "seed the policies' random tie-breaks", default_text="random")

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.engines and not self.registry and not self.admin_key:
            raise ValueError("give --engine URL, --registry redis://..., or --admin-key to add engines "
                             "through the admin API")
        if len(set(self.engines)) != len(self.engines):
            raise ValueError("the same --engine URL is given twice")
        if (self.index == "redis" or self.events == "redis") and not self.redis:
            raise ValueError("--index redis and --events redis need --redis URL")
        if self.limits.max_body_bytes > self.connections.body_buffer_bytes:
            raise ValueError(f"--max-body-bytes ({self.limits.max_body_bytes}) must not exceed --body-buffer-bytes "
                             f"({self.connections.body_buffer_bytes}): a body that large could never be received")
        self.foreign_engines()  # validates --engine-kind and --kv-event-*

    def foreign_engines(self):
        """({engine URL: kind}, {engine URL: ZeroMQ event sources}) from the flags."""
        from kvroute.router.fleet.kinds import parse_kinds
        from kvroute.router.kvevents.sources import parse_sources

        return (parse_kinds(self.engine_kinds, self.engines),
                parse_sources(self.kv_event_sources, self.kv_event_replay_sources, self.engines))

    @property
    def shared_admission(self) -> bool:
        """Admission state shared with the other router replicas and workers through Redis."""
        return bool(self.redis) and self.admission_sync_s > 0

    def tenant_keys(self) -> tuple[tuple[str, str], ...]:
        """(tenant, key) of every --api-key (a plain key is the default tenant's)."""
        from kvroute.router.service.tenant_book import split_keys

        return split_keys(self.api_key)[1]
