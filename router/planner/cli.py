"""`kvroute planner`: keep a router's fleet at the prefill:decode split its load needs."""

from __future__ import annotations

import dataclasses
import json
import sys

from kvroute.router.contract.cli_parser import Command, SettingsParser
from kvroute.router.contract.constraints import HTTP_URL, Range
from kvroute.router.contract.serve import LogConfig, bind_socket, run_app, setup_logging
from kvroute.router.contract.settings import setting
from kvroute.router.contract.settings_values import build, pick
from kvroute.router.planner.config import PlannerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannerRun:
    """planner service"""

    router: str = setting(help="the router's base URL", check=HTTP_URL, metavar="URL")
    admin_key: str | None = setting(None, "the router's --admin-key (needed to switch roles)")
    profile: str | None = setting(None, "a JSON profile (`kvroute sim --profile` writes one): its "
                                        "prefill_tokens_per_s, decode_tokens_per_s and decode step model "
                                        "(decode_step_s, decode_seq_s, decode_context_s, max_running) override the "
                                        "flags", metavar="FILE")
    host: str = setting("127.0.0.1", "address of the planner's own /planner and /metrics")
    port: int = setting(8100, "port of the planner's own /planner and /metrics", check=Range(0, 65535))
    dry_run: bool = setting(False, "decide and report, switch nothing")


COMMAND = Command(prog="kvroute planner", description=(
    "Watch a router's load and SLO attainment and switch its engines' roles (prefill, decode, both) to keep goodput "
    "high; publish the replica counts the load asks for."), env_prefix="KVROUTE_PLANNER_",
    sections=(PlannerRun, PlannerConfig, LogConfig), doc="docs/fleet.md")


def build_parser() -> SettingsParser:
    return COMMAND.parser()


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
        values = pick(PlannerConfig, vars(args))
        if args.profile:
            values.update(read_profile(args.profile, fields))
        config = build(PlannerConfig, **values)
        sock = bind_socket(args.host, args.port)
    except (ValueError, OSError) as e:
        print(f"kvroute planner: {e}", file=sys.stderr)
        return 2
    service = PlannerService(config, args.router, args.admin_key, args.dry_run)
    return run_app(create_app(service), sock, "planner")


if __name__ == "__main__":
    sys.exit(main())
