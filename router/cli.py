"""`kvroute router`: run the KV-cache-aware router."""

from __future__ import annotations

import argparse
import sys

from router.config import EVENT_SOURCES, RouterConfig
from router.serve import config_values, setup_logging


def build_parser() -> argparse.ArgumentParser:
    from router.index import INDEXES
    from router.policies import POLICIES

    d = RouterConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="kvroute router", description="Run the KV-cache-aware OpenAI router.")
    p.add_argument("--engine", dest="engines", action="append", required=True, metavar="URL",
                   help="engine base URL (repeat for each engine)")
    p.add_argument("--host", default=d["host"].default)
    p.add_argument("--port", type=int, default=d["port"].default)
    p.add_argument("--policy", choices=sorted(POLICIES), default=d["policy"].default)
    p.add_argument("--index", choices=sorted(INDEXES), default=d["index"].default)
    p.add_argument("--redis", default=None, help="Redis URL for --index redis and/or --events redis")
    p.add_argument("--events", choices=EVENT_SOURCES, default=d["events"].default,
                   help="poll each engine's /kv/events (default) or read the engines' Redis stream")
    p.add_argument("--tokenizer", default=None, help="local HF model dir (for --model DIR engines)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--admin-key", default=None, help="require 'Authorization: Bearer KEY' on /router/*")
    p.add_argument("--max-inflight", type=int, default=d["max_inflight"].default,
                   help="per instance; beyond it requests get 429 (0 = unlimited)")
    p.add_argument("--max-retries", type=int, default=d["max_retries"].default)
    p.add_argument("--health-interval-s", type=float, default=d["health_interval_s"].default)
    p.add_argument("--eject-after", type=int, default=d["eject_after"].default)
    p.add_argument("--readmit-after", type=int, default=d["readmit_after"].default)
    p.add_argument("--load-interval-s", type=float, default=d["load_interval_s"].default)
    p.add_argument("--clear-grace-s", type=float, default=d["clear_grace_s"].default)
    p.add_argument("--pd-min-uncached", type=int, default=d["pd_min_uncached"].default,
                   help="with prefill and decode engines: prompts with fewer uncached tokens skip the prefill stage")
    p.add_argument("--engine-kind", dest="engine_kinds", action="append", default=[], metavar="[URL=]KIND",
                   help="kvroute, vllm, sglang or auto (default: detect); KIND alone sets every engine's")
    p.add_argument("--kv-event-source", dest="kv_event_sources", action="append", default=[],
                   metavar="URL=ENDPOINT[,ENDPOINT...]", help="an engine's ZeroMQ KV event publisher (vLLM format)")
    p.add_argument("--kv-event-replay-source", dest="kv_event_replay_sources", action="append", default=[],
                   metavar="URL=ENDPOINT[,ENDPOINT...]", help="its replay socket, asked for batches missed in a gap")
    p.add_argument("--kv-event-block-size", type=int, default=d["kv_event_block_size"].default,
                   help="the router's block size for vLLM/SGLang engines (engine block sizes are mapped)")
    p.add_argument("--kv-event-topic", default=d["kv_event_topic"].default, help="ZeroMQ topic prefix (default: all)")
    p.add_argument("--kv-event-replay-timeout-s", type=float, default=d["kv_event_replay_timeout_s"].default)
    p.add_argument("--seed", type=int, default=None, help="seed the policies' random tie-breaks")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    values = config_values(RouterConfig, args)
    for name in ("engines", "engine_kinds", "kv_event_sources", "kv_event_replay_sources"):
        values[name] = tuple(values[name])
    try:
        config = RouterConfig(**values)
        from router.tokenizer import load_tokenizer

        load_tokenizer(config.tokenizer)
    except ValueError as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 2
    from router.app import create_app
    from router.serve import run_app

    return run_app(create_app(config), config.host, config.port)


if __name__ == "__main__":
    sys.exit(main())
