"""`kvroute` console script: one subcommand per component, imported lazily.

The router side never imports torch, so `kvroute router` works without it.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys

from kvroute.router.contract.interrupt import INTERRUPTED, interrupted, run_command

SUBCOMMANDS = {
    "engine": ("kvroute.engine.service.cli", "Run an engine server (paged KV cache, prefix caching, KV events)."),
    "router": ("kvroute.router.service.cli", "Run the KV-cache-aware OpenAI-compatible router."),
    "loadgen": ("kvroute.loadgen.cli", "Drive an OpenAI-compatible endpoint with a workload."),
    "bench": ("kvroute.loadgen.bench", "Start a local cluster and compare routing policies."),
    "demo": ("kvroute.loadgen.demo", "Quick policy comparison on real torch engines."),
    "sim": ("kvroute.loadgen.sim", "Discrete-event simulation of a large cluster."),
    "planner": ("kvroute.router.planner.cli", "Switch engines' prefill/decode roles online to keep goodput high."),
    "chaos": ("kvroute.loadgen.chaos.cli",
              "Faults and fuzz against a local fleet under load; one table, invariants checked."),
}


def _usage() -> str:
    lines = ["usage: kvroute [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`kvroute <command> --help` lists the command's flags with their defaults."]
    return "\n".join(lines)


def version() -> str:
    from kvroute import __version__

    return __version__


def console() -> None:
    """The `kvroute` command (`python -m kvroute` too): `main`'s status as the process's. After Ctrl-C
    (130) the exit handlers run, then the process exits 130 itself: a KeyboardInterrupt raised in
    code CPython ran for an extension's import (torch's) leaves the interpreter set to kill itself
    with SIGINT at exit (status -2) even though the command caught it and said so in one line."""
    code = main()
    if code != INTERRUPTED:
        sys.exit(code)
    atexit._run_exitfuncs()  # what a normal exit runs: the processes a command started are stopped
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `kvroute router --help | head`: the reader left; say nothing more (no traceback) and
        # keep Python's own flush at exit from failing again on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"kvroute {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        from kvroute.router.contract.settings import did_you_mean

        print(f"kvroute: unknown command {name!r}{did_you_mean(name, SUBCOMMANDS)}; choose from "
              f"{', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        print(f"kvroute {name}: not available ({e})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while a heavy import (torch) loads
        return interrupted(f"kvroute {name}")
    return run_command(f"kvroute {name}", module.main, rest)


if __name__ == "__main__":
    console()
