"""`kvroute router`: run the KV-cache-aware router."""

from __future__ import annotations

import argparse
import os
import sys

from kvroute.router.contract.cli_help import HelpFormatter
from kvroute.router.contract.serve import bind_socket, config_values, run_app, setup_logging
from kvroute.router.service.config import EVENT_SOURCES, RouterConfig
from kvroute.router.service.tenant_book import TenantBook, split_keys


def _edges(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"priorities are integers, comma-separated, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    from kvroute.router.decision.policies import POLICIES
    from kvroute.router.index import INDEXES

    d = RouterConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="kvroute router", description="Run the KV-cache-aware OpenAI router.",
                                formatter_class=HelpFormatter)
    p.add_argument("--engine", dest="engines", action="append", default=[], metavar="URL",
                   help="engine base URL (repeat for each engine)")
    p.add_argument("--host", default=d["host"].default, help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=d["port"].default, help="port to listen on")
    p.add_argument("--policy", choices=sorted(POLICIES), default=d["policy"].default, help="routing policy")
    p.add_argument("--index", choices=sorted(INDEXES), default=d["index"].default,
                   help="where the block -> instance index lives (redis: shared by router replicas)")
    p.add_argument("--redis", default=None, help="Redis URL for --index redis and/or --events redis")
    p.add_argument("--registry", default=None,
                   help="follow this Redis fleet registry (redis://...): engines join and leave at run time")
    p.add_argument("--events", choices=EVENT_SOURCES, default=d["events"].default,
                   help="poll each engine's /kv/events, or read the engines' Redis stream")
    p.add_argument("--tokenizer", default=None,
                   help="local HF model dir, for --model DIR engines (default: the built-in tokenizer)")
    p.add_argument("--api-key", action="append", default=[], metavar="[NAME=]KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/*; NAME=KEY makes the key tenant NAME's "
                        "(repeat for each key)")
    p.add_argument("--tenants", default=None, metavar="FILE",
                   help="tenant file (JSON or TOML: weight, slo_ttft_s, rate, burst, max_concurrency, keys, "
                        "allow_request_slo); reloaded on SIGHUP and POST /admin/tenants/reload (docs/admission.md)")
    p.add_argument("--tenant-header", default=None, metavar="NAME",
                   help="the request header that names the tenant, among those of --tenants FILE (any other "
                        "value: the default tenant); refused beside API keys without --trust-tenant-header")
    p.add_argument("--trust-tenant-header", action="store_true",
                   help="with API keys and --tenant-header: a gateway in front sets the header (and drops the "
                        "clients' own), so it may name the tenant instead of the key")
    p.add_argument("--slo-ttft-s", type=float, default=None,
                   help="admission: the default TTFT SLO; requests predicted to miss it wait or are refused "
                        "with 429/503 + Retry-After (default: off)")
    p.add_argument("--admission-margin", type=float, default=d["admission_margin"].default,
                   help="admission: engines may hold predicted TTFT up to SLO x (1 + margin) before requests "
                        "wait in the router's queue")
    p.add_argument("--admission-queue", type=int, default=d["admission_queue"].default,
                   help="admission: requests that may wait in the router's queue (all tenants)")
    p.add_argument("--priority-edges", type=_edges, default=d["priority_edges"].default, metavar="P,P",
                   help="admission: priority bands cut at these priorities (lower is more urgent)")
    p.add_argument("--admission-sync-s", type=float, default=d["admission_sync_s"].default,
                   help="with --redis: router replicas and workers share admission (tenants' limits, weighted "
                        "shares, fair-queue virtual time, instances' router-side load), synced this often in "
                        "the background; 0: each process admits alone (docs/admission.md)")
    p.add_argument("--admin-key", default=os.environ.get("KVROUTE_ADMIN_KEY"),
                   help="require 'Authorization: Bearer KEY' on /router/* and /workers; also the key the router "
                        "and `kvroute planner` use for engines' /admin/* (default: $KVROUTE_ADMIN_KEY)")
    p.add_argument("--max-inflight", type=int, default=d["max_inflight"].default,
                   help="per instance; beyond it requests get 429 (0 = unlimited)")
    p.add_argument("--fast-candidates", type=int, default=d["fast_candidates"].default,
                   help="K > 0: a decision scores the first block's holders, recent senders of it and the K least "
                        "loaded instances only (0: every instance)")
    p.add_argument("--recent-ttl-s", type=float, default=d["recent_ttl_s"].default,
                   help="with --fast-candidates: how long an instance sent a prefix stays its candidate")
    p.add_argument("--max-retries", type=int, default=d["max_retries"].default,
                   help="retries on another instance before the first byte")
    p.add_argument("--health-interval-s", type=float, default=d["health_interval_s"].default,
                   help="seconds between health checks of each engine")
    p.add_argument("--eject-after", type=int, default=d["eject_after"].default,
                   help="consecutive failed checks (or failed requests) that eject an engine")
    p.add_argument("--ejection-s", type=float, default=d["ejection_s"].default,
                   help="seconds an instance ejected for failed requests stays out (doubles per ejection)")
    p.add_argument("--readmit-after", type=int, default=d["readmit_after"].default,
                   help="consecutive good checks that readmit an ejected engine")
    p.add_argument("--load-interval-s", type=float, default=d["load_interval_s"].default,
                   help="seconds between polls of each engine's /load")
    p.add_argument("--index-ttl-s", type=float, default=d["index_ttl_s"].default,
                   help="the index forgets an instance that no router sharing it has seen for this long")
    p.add_argument("--index-timeout-s", type=float, default=d["index_timeout_s"].default,
                   help="timeout of each Redis index call")
    p.add_argument("--index-breaker-failures", type=int, default=d["index_breaker_failures"].default,
                   help="consecutive index failures after which the router routes on load alone for a cool-down")
    p.add_argument("--index-breaker-cooldown-s", type=float, default=d["index_breaker_cooldown_s"].default,
                   help="seconds the index breaker stays open before it probes Redis again")
    p.add_argument("--first-byte-timeout-s", type=float, default=d["first_byte_timeout_s"].default,
                   help="streams: seconds to wait for an engine's first chunk before retrying elsewhere")
    p.add_argument("--read-timeout-s", type=float, default=d["read_timeout_s"].default,
                   help="streams: seconds allowed between two chunks from an engine")
    p.add_argument("--request-timeout-s", type=float, default=d["request_timeout_s"].default,
                   help="non-streamed requests: seconds to wait for the whole answer")
    p.add_argument("--max-body-bytes", type=int, default=d["max_body_bytes"].default,
                   help="largest request body; 0 = 32 bytes per token of the engines' context, at least 1 MiB")
    p.add_argument("--max-prompt-chars", type=int, default=d["max_prompt_chars"].default,
                   help="longest prompt in characters, checked before tokenizing; 0 = 8 per token of context")
    p.add_argument("--tokenize-workers", type=int, default=d["tokenize_workers"].default,
                   help="threads that tokenize long prompts off the event loop")
    p.add_argument("--tokenize-queue", type=int, default=d["tokenize_queue"].default,
                   help="long prompts of one tenant that may wait for a tokenizer thread (tenants are served "
                        "fairly); beyond it, 503 + Retry-After for that tenant")
    p.add_argument("--tokenize-idle-inline-chars", type=int, default=d["tokenize_idle_inline_chars"].default,
                   help="prompts shorter than this are tokenized on the event loop while no other request is "
                        "in flight (no thread hop); 0 = long prompts always go to the tokenizer threads")
    p.add_argument("--pd-min-uncached", type=int, default=d["pd_min_uncached"].default,
                   help="with prefill and decode engines: prompts with fewer uncached tokens skip the prefill stage")
    p.add_argument("--kv-secret", default=None,
                   help="shared secret signing prefill/decode transfer grants (default: $KVROUTE_KV_SECRET)")
    p.add_argument("--engine-kind", dest="engine_kinds", action="append", default=[], metavar="[URL=]KIND",
                   help="kvroute, vllm, sglang or auto (default: detect); KIND alone sets every engine's")
    p.add_argument("--kv-event-source", dest="kv_event_sources", action="append", default=[],
                   metavar="URL=ENDPOINT[,ENDPOINT...]", help="an engine's ZeroMQ KV event publisher (vLLM format)")
    p.add_argument("--kv-event-replay-source", dest="kv_event_replay_sources", action="append", default=[],
                   metavar="URL=ENDPOINT[,ENDPOINT...]", help="its replay socket, asked for batches missed in a gap")
    p.add_argument("--kv-event-block-size", type=int, default=d["kv_event_block_size"].default,
                   help="the router's block size for vLLM/SGLang engines (engine block sizes are mapped)")
    p.add_argument("--kv-event-topic", default=d["kv_event_topic"].default, help="ZeroMQ topic prefix (default: all)")
    p.add_argument("--kv-event-replay-timeout-s", type=float, default=d["kv_event_replay_timeout_s"].default,
                   help="seconds to wait for a replay before rebuilding an instance from new events")
    p.add_argument("--header-timeout-s", type=float, default=d["header_timeout_s"].default,
                   help="close a connection whose request head is not complete this long after it began")
    p.add_argument("--body-timeout-s", type=float, default=d["body_timeout_s"].default,
                   help="answer 408 and close when a request body sends no byte for this long (as nginx's "
                        "client_body_timeout)")
    p.add_argument("--idle-timeout-s", type=float, default=d["idle_timeout_s"].default,
                   help="close a keep-alive connection idle this long")
    p.add_argument("--connection-buffer-bytes", type=int, default=d["connection_buffer_bytes"].default,
                   help="bytes one connection reads ahead of its handler (a body not taken yet, pipelined "
                        "requests); past it, reading pauses")
    p.add_argument("--body-buffer-bytes", type=int, default=d["body_buffer_bytes"].default,
                   help="request bodies being received, all connections together; a body past it is "
                        "refused (503 + Retry-After)")
    p.add_argument("--max-connections", type=int, default=d["max_connections"].default,
                   help="connections at most (0: the descriptor limit less 64); a new one past it displaces the "
                        "connection waiting longest on its client, or is refused when none waits")
    p.add_argument("--max-connections-per-peer", type=int, default=d["max_connections_per_peer"].default,
                   help="refuse a client address's connections past this many")
    p.add_argument("--kv-event-max-blocks", type=int, default=d["kv_event_max_blocks"].default,
                   help="engine blocks kept per ZeroMQ-fed instance that advertises no capacity (else 4x its own)")
    p.add_argument("--workers", type=int, default=d["workers"].default,
                   help="router processes on one port (SO_REUSEPORT), for more than one core; each keeps its own "
                        "index (or shares --index redis) fed by the same events")
    p.add_argument("--ext-proc-port", type=int, default=None, metavar="PORT",
                   help="also serve Envoy's ext_proc gRPC service on PORT: kvroute as the endpoint picker of a "
                        "gateway (the Gateway API Inference Extension; docs/gateway.md); needs kvroute[gateway]")
    p.add_argument("--ext-proc-fallbacks", type=int, default=d["ext_proc_fallbacks"].default, metavar="N",
                   help="next-best endpoints after the choice in x-gateway-destination-endpoint, for gateways that "
                        "try the list in order (0: the choice alone, as plain Envoy's ORIGINAL_DST cluster needs)")
    p.add_argument("--seed", type=int, default=None, help="seed the policies' random tie-breaks (default: random)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def _check_gateway_extra() -> None:
    """--ext-proc-port's packages (grpcio, grpcio-health-checking, xds-protos), or a ValueError saying so."""
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
        from grpc_health.v1 import health  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--ext-proc-port needs grpcio, grpcio-health-checking and xds-protos ({e}): "
                         "pip install 'kvroute[gateway]'") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    values = config_values(RouterConfig, args)
    for name in ("engines", "engine_kinds", "kv_event_sources", "kv_event_replay_sources"):
        values[name] = tuple(values[name])
    values["api_key"], values["api_keys"] = split_keys(args.api_key)
    try:
        setup_logging(args.log_level)
        config = RouterConfig(**values)
        from kvroute.router.contract.tokenizer import load_tokenizer

        load_tokenizer(config.tokenizer)
        if config.ext_proc_port is not None:
            _check_gateway_extra()
        TenantBook(config.tenants, config.tenant_keys(), config.tenant_header, config.trust_tenant_header)
    except (ValueError, OSError) as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 2
    from kvroute.router.service.workers import bind_reuseport, supervise, worker_socket

    sock = worker_socket()  # one of --workers: the supervisor bound it
    try:
        if sock is None and config.workers > 1:
            return supervise(argv, bind_reuseport(config.host, config.port, config.workers))
        if sock is None:
            sock = bind_socket(config.host, config.port)
    except OSError as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 1
    from kvroute.router.service.app import create_app

    return run_app(create_app(config), sock, "router")


if __name__ == "__main__":
    sys.exit(main())
