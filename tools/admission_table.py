"""The table of docs/admission.md's process runs, from the directory tools/admission_processes.sh wrote.

    python tools/admission_table.py OUT_DIR

One row per run and tenant: the share and rate of requests within the SLO, TTFT p90, the share of
admitted requests within the SLO, refusals and their latency (p90, at the client).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

RUNS = (("alone25", "B alone 25/s, off"), ("alone35", "B alone 35/s, off"), ("flood-off", "flood, off"),
        ("flood-on", "flood, on"), ("priority", "priority, on"))


def rows(out: pathlib.Path) -> list[str]:
    lines = ["| run | tenant | in-SLO share | in-SLO req/s | TTFT p90 s | admitted in SLO | refused | refusal p90 s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label in RUNS:
        path = out / name / "summary.json"
        if not path.exists():
            continue
        tenants = json.loads(path.read_text())["tenants"]
        for tenant, s in tenants.items():
            if tenant == "all" and len(tenants) == 2:
                continue  # one tenant: its row is the whole run
            refused = s.get("refused", 0)
            admitted = s["requests"] - refused
            in_slo = s["goodput"] * s["requests"]
            late = f"{s['refused_p90_s']:.3f}" if refused else "-"
            lines.append(f"| {label} | {tenant} | {s['goodput']:.3f} | {s['goodput_rps']:.1f} | {s['ttft_p90_s']:.3f} "
                         f"| {in_slo / admitted if admitted else 0:.3f} | {refused} | {late} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="the directory tools/admission_processes.sh wrote")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        print(f"admission_table: {args.out} is not a directory", file=sys.stderr)
        return 2
    print("\n".join(rows(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
