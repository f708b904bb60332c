"""`kvroute demo`: a quick policy comparison on real torch engines (the README's first command).

Four engines with the built-in tiny model (real PyTorch forward, 1 thread each) behind
the router, one run per policy on the same shared-prefix workload; prints the table and
where the plots are. Takes 2-3 minutes on a 2-core machine.
"""

from __future__ import annotations

import sys

from loadgen import bench

DEMO_ARGS = ["--quick", "--backend", "torch", "--out", "kvroute-demo"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nAny `kvroute bench` flag may be added to override the demo's settings, e.g. --out DIR.")
        return 0
    print("kvroute demo: 4 torch engines (tiny model) + router; comparing "
          f"{bench.DEFAULT_POLICIES.replace(',', ', ')} on a shared-prefix workload", file=sys.stderr)
    return bench.main(DEMO_ARGS + argv)


if __name__ == "__main__":
    sys.exit(main())
