"""`kvroute demo`: a quick policy comparison on real torch engines (the README's first command).

Four engines with the built-in tiny model (real PyTorch forward, 1 thread each) behind
the router, one run per policy on the same shared-prefix workload; prints the table and
where the plots are. Takes 2-3 minutes on a 2-core machine.
"""

from __future__ import annotations

import dataclasses
import sys

from kvroute.loadgen import bench

PROG = "kvroute demo"

DEMO_ARGS = ["--quick", "--backend", "torch", "--out", "kvroute-demo"]
COMMAND = dataclasses.replace(bench.COMMAND, prog=PROG, env_prefix="KVROUTE_DEMO_", doc="")  # bench's flags


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nAny `kvroute bench` flag may be added to override the demo's settings ("
              + " ".join(DEMO_ARGS) + "):\n")
        print(bench.build_parser(PROG).format_help())
        return 0
    try:  # every flag is checked before the banner and before anything starts
        args, policies, extras = bench.parse(DEMO_ARGS + argv, PROG)
    except SystemExit as e:  # a usage error (said on stderr)
        return int(e.code or 0)
    except ValueError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    print(f"{PROG}: {args.engines} {args.backend} engines (tiny model) + router; comparing "
          f"{', '.join(policies)} on a {args.workload} workload", file=sys.stderr)
    return bench.run(args, policies, extras, PROG)


if __name__ == "__main__":
    sys.exit(main())
