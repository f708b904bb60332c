"""`kvroute chaos`: faults and fuzz against a local fleet under load; one table, invariants checked.

Exit status: 0 when every invariant held, 1 when one broke (each is named on stderr),
2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import orjson

from kvroute.loadgen.chaos.config import ChaosConfig
from kvroute.loadgen.chaos.rows import markdown
from kvroute.loadgen.chaos.runner import run_chaos
from kvroute.loadgen.chaos.scenarios import SCENARIOS, chosen
from kvroute.loadgen.out_dir import FORCE_HELP, check_out_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvroute chaos", description=__doc__.split("\n")[0],
                                epilog="scenarios: " + "; ".join(f"{n}: {s.summary}" for n, s in SCENARIOS.items()))
    p.add_argument("--out", default=None, help="write results.json, results.md and the processes' logs here")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--quick", action="store_true", help="a fuzz sample and one engine kill on a smaller fleet (~20 s)")
    p.add_argument("--scenarios", type=lambda v: tuple(s.strip() for s in v.split(",") if s.strip()), default=None,
                   help="comma-separated, in the order given (default: all; --quick: fuzz,engine-kill)")
    p.add_argument("--engines", type=int, default=None, help="sim engines (default 3; --quick 2)")
    p.add_argument("--routers", type=int, default=None, help="routers sharing the Redis index (default 2; --quick 1)")
    p.add_argument("--rate", type=float, default=None, help="background requests per second (default 40)")
    p.add_argument("--fuzz-cases", type=int, default=None,
                   help="malformed bodies, half to a router, half to an engine, spread over every category "
                        "(default 0: the whole catalog, ~4,900; --quick 300)")
    p.add_argument("--fuzz-slow-s", type=float, default=None, help="slowest acceptable answer to a malformed body")
    p.add_argument("--streams", type=int, default=None, help="concurrent streams in the streams scenario (1000)")
    p.add_argument("--hold-s", type=float, default=None, help="how long each fault lasts (default 3)")
    p.add_argument("--settle-s", type=float, default=None, help="load after each recovery, in its row (default 1)")
    p.add_argument("--wait-s", type=float, default=None, help="longest wait for an ejection or a resync (default 30)")
    p.add_argument("--rss-growth-mb", type=float, default=None, help="fuzz: largest acceptable peak RSS growth")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--engine-arg", dest="engine_args", action="append", default=None, metavar="ARG",
                   help="extra flag for every engine, e.g. --engine-arg=--time-scale=0.1 (repeat)")
    p.add_argument("--router-arg", dest="router_args", action="append", default=None, metavar="ARG",
                   help="extra flag for every router, e.g. --router-arg=--eject-after=2 (repeat)")
    return p


def config_from(args: argparse.Namespace) -> ChaosConfig:
    given = {k: v for k, v in vars(args).items() if v is not None and k != "force"}
    for key in ("engine_args", "router_args"):
        if key in given:
            given[key] = tuple(given[key])
    if args.quick:
        given = {**ChaosConfig.quick_defaults(), **given}
    config = ChaosConfig(**given)
    chosen(config)  # its scenarios exist and the fleet can run them (ValueError otherwise)
    return config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from(args)
        if config.out:
            check_out_dir(config.out, args.force)
    except ValueError as e:
        print(f"kvroute chaos: {e}", file=sys.stderr)
        return 2
    log_dir = os.path.join(config.out, "logs") if config.out else None
    try:
        result = asyncio.run(run_chaos(config, log_dir))
    except RuntimeError as e:  # the fleet could not start
        print(f"kvroute chaos: {e}", file=sys.stderr)
        return 1
    table = markdown(result.rows)
    print(table)
    if config.out:
        with open(os.path.join(config.out, "results.json"), "wb") as f:
            f.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2))
        with open(os.path.join(config.out, "results.md"), "w") as f:
            f.write(table + "\n")
    for v in result.violations:
        print(f"kvroute chaos: {v.line()}", file=sys.stderr)
    verdict = "every invariant held" if not result.violations else f"{len(result.violations)} invariant(s) broken"
    print(f"kvroute chaos: {verdict} ({result.seconds:.0f}s; logs in {result.log_dir})", file=sys.stderr)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
