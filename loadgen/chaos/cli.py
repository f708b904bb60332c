"""`kvroute chaos`: faults and fuzz against a local fleet under load; one table, invariants checked.

Exit status: 0 when every invariant held, 1 when one broke (each is named on stderr),
2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys

import orjson

from kvroute.loadgen.chaos.config import ChaosConfig
from kvroute.loadgen.chaos.rows import markdown
from kvroute.loadgen.chaos.runner import run_chaos
from kvroute.loadgen.chaos.scenarios import SCENARIOS, chosen
from kvroute.loadgen.out_dir import ForceFlag, check_out_dir
from kvroute.router.contract.cli_parser import Command, SettingsParser, given
from kvroute.router.contract.settings_values import build, pick

COMMAND = Command(prog="kvroute chaos", description=__doc__.split("\n")[0], env_prefix="KVROUTE_CHAOS_",
                  sections=(ChaosConfig, ForceFlag), doc="docs/loadgen.md",
                  epilog="scenarios: " + "; ".join(f"{n}: {s.summary}" for n, s in SCENARIOS.items()))


def build_parser() -> SettingsParser:
    return COMMAND.parser()


def config_from(args: argparse.Namespace) -> ChaosConfig:
    """The settings given; with --quick, its smaller fleet and sample for those not given."""
    values = pick(ChaosConfig, {name: getattr(args, name) for name in given(args)})
    if args.quick:
        values = {**ChaosConfig.quick_defaults(), **values}
    config = build(ChaosConfig, **values)
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
    if log_dir is not None:  # --force: an earlier run's logs go, or its lines would be read as this run's
        shutil.rmtree(log_dir, ignore_errors=True)
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
