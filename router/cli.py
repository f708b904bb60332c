"""`kvroute router`: run the KV-cache-aware router."""

from __future__ import annotations

import argparse
import sys

from router.config import EVENT_SOURCES, RouterConfig
from router.cli_help import HelpFormatter
from router.serve import bind_socket, config_values, run_app, setup_logging


def build_parser() -> argparse.ArgumentParser:
    from router.index import INDEXES
    from router.policies import POLICIES

    d = RouterConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="kvroute router", description="Run the KV-cache-aware OpenAI router.",
                                formatter_class=HelpFormatter)
    p.add_argument("--engine", dest="engines", action="append", required=True, metavar="URL",
                   help="engine base URL (repeat for each engine)")
    p.add_argument("--host", default=d["host"].default, help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=d["port"].default, help="port to listen on")
    p.add_argument("--policy", choices=sorted(POLICIES), default=d["policy"].default, help="routing policy")
    p.add_argument("--index", choices=sorted(INDEXES), default=d["index"].default,
                   help="where the block -> instance index lives (redis: shared by router replicas)")
    p.add_argument("--redis", default=None, help="Redis URL for --index redis and/or --events redis")
    p.add_argument("--events", choices=EVENT_SOURCES, default=d["events"].default,
                   help="poll each engine's /kv/events, or read the engines' Redis stream")
    p.add_argument("--tokenizer", default=None,
                   help="local HF model dir, for --model DIR engines (default: the built-in tokenizer)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--admin-key", default=None, help="require 'Authorization: Bearer KEY' on /router/*")
    p.add_argument("--max-inflight", type=int, default=d["max_inflight"].default,
                   help="per instance; beyond it requests get 429 (0 = unlimited)")
    p.add_argument("--max-retries", type=int, default=d["max_retries"].default,
                   help="retries on another instance before the first byte")
    p.add_argument("--health-interval-s", type=float, default=d["health_interval_s"].default,
                   help="seconds between health checks of each engine")
    p.add_argument("--eject-after", type=int, default=d["eject_after"].default,
                   help="consecutive failed checks that eject an engine")
    p.add_argument("--readmit-after", type=int, default=d["readmit_after"].default,
                   help="consecutive good checks that readmit an ejected engine")
    p.add_argument("--load-interval-s", type=float, default=d["load_interval_s"].default,
                   help="seconds between polls of each engine's /load")
    p.add_argument("--clear-grace-s", type=float, default=d["clear_grace_s"].default,
                   help="seconds an engine may be down before its index entries are cleared")
    p.add_argument("--pd-min-uncached", type=int, default=d["pd_min_uncached"].default,
                   help="with prefill and decode engines: prompts with fewer uncached tokens skip the prefill stage")
    p.add_argument("--seed", type=int, default=None, help="seed the policies' random tie-breaks (default: random)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    values = config_values(RouterConfig, args)
    values["engines"] = tuple(values["engines"])
    try:
        setup_logging(args.log_level)
        config = RouterConfig(**values)
        from router.tokenizer import load_tokenizer

        load_tokenizer(config.tokenizer)
    except ValueError as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as e:
        print(f"kvroute router: {e}", file=sys.stderr)
        return 1
    from router.app import create_app

    return run_app(create_app(config), sock, "router")


if __name__ == "__main__":
    sys.exit(main())
