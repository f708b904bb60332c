"""`kvroute planner`: keep a router's fleet at the prefill:decode split its load needs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from kvroute.router.contract.serve import bind_socket, run_app, setup_logging
from kvroute.router.planner.decide import PlannerConfig


def build_parser() -> argparse.ArgumentParser:
    d = PlannerConfig()
    p = argparse.ArgumentParser(prog="kvroute planner", description=(
        "Watch a router's load and SLO attainment and switch its engines' roles (prefill, decode, both) "
        "to keep goodput high; publish the replica counts the load asks for."))
    p.add_argument("--router", required=True, help="the router's base URL")
    p.add_argument("--admin-key", default=None, help="the router's --admin-key (needed to switch roles)")
    p.add_argument("--slo-ttft", dest="slo_ttft_s", type=float, default=d.slo_ttft_s, help="TTFT SLO, seconds")
    p.add_argument("--slo-tpot", dest="slo_tpot_s", type=float, default=d.slo_tpot_s, help="TPOT SLO, seconds")
    p.add_argument("--prefill-tokens-per-s", type=float, default=d.prefill_tokens_per_s,
                   help="one engine's prefill capacity (from a profile; `kvroute sim --profile` prints one)")
    p.add_argument("--decode-tokens-per-s", type=float, default=d.decode_tokens_per_s,
                   help="one engine's decode capacity at the TPOT SLO (from a profile)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="a JSON profile (`kvroute sim --profile` writes one): its prefill_tokens_per_s, "
                        "decode_tokens_per_s and decode step model (decode_step_s, decode_seq_s, decode_context_s, "
                        "max_running) override the flags")
    p.add_argument("--interval-s", type=float, default=d.interval_s, help="seconds between decisions")
    p.add_argument("--window-s", type=float, default=d.window_s, help="seconds of recent requests each decision reads")
    p.add_argument("--colocate-below", type=float, default=d.colocate_below,
                   help="run colocated (all 'both') below this estimated utilization")
    p.add_argument("--hold", type=int, default=d.hold, help="intervals a new split must persist before it is applied")
    p.add_argument("--cooldown-s", type=float, default=d.cooldown_s, help="seconds between two role changes")
    p.add_argument("--host", default="127.0.0.1", help="address of the planner's own /planner and /metrics")
    p.add_argument("--port", type=int, default=8100, help="port of the planner's own /planner and /metrics")
    p.add_argument("--dry-run", action="store_true", help="decide and report, switch nothing")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def read_profile(path: str, fields: set[str]) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the profile {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the profile {path} must hold a JSON object")
    keys = ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_step_s", "decode_seq_s", "decode_context_s",
            "max_running")
    return {k: data[k] for k in keys if k in data and k in fields}


def main(argv: list[str] | None = None) -> int:
    from kvroute.router.planner.service import PlannerService, create_app

    args = build_parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(PlannerConfig)}
    try:
        setup_logging(args.log_level)
        values = {k: v for k, v in vars(args).items() if k in fields}
        if args.profile:
            values.update(read_profile(args.profile, fields))
        config = PlannerConfig(**values)
        if not args.router.startswith(("http://", "https://")):
            raise ValueError(f"--router must be an http(s) URL, got {args.router!r}")
        sock = bind_socket(args.host, args.port)
    except (ValueError, OSError) as e:
        print(f"kvroute planner: {e}", file=sys.stderr)
        return 2
    service = PlannerService(config, args.router, args.admin_key, args.dry_run)
    return run_app(create_app(service), sock, "planner")


if __name__ == "__main__":
    sys.exit(main())
