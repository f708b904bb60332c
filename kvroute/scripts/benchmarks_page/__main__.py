"""Write docs/benchmarks.md from the tree: run every registered benchmark, render what it wrote.

    python -m kvroute.scripts.benchmarks_page [--quick] [--only NAME,...] [--work DIR] [--out docs/benchmarks.md]
    python -m kvroute.scripts.benchmarks_page --list

Each entry of kvroute/scripts/benchmarks_page/entries.py is run as a subprocess with this interpreter
from the repository root (so the checkout's code runs, whatever the current directory); its JSON is
parsed and rendered as a Markdown table under its command. The page holds only those figures and one
machine line (cores, load average, date, commit). --quick leaves out the full-only entries; --only
runs the named ones into the page as it is: their sections are replaced (each saying what ran it, when
and at which commit), the others kept. Entries never run are listed with their command and no figures.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from kvroute.benchmarks.checkout import root
from kvroute.scripts.benchmarks_page.entries import ENTRIES, Entry
from kvroute.scripts.benchmarks_page.page import machine_line, page, reused, run_entry, selected, shown, spliced


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m kvroute.scripts.benchmarks_page",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="leave out the full-only entries")
    p.add_argument("--only", help="comma-separated entry names (see --list)")
    p.add_argument("--work", help="where the commands write their files (default: a temporary directory)")
    p.add_argument("--reuse", default="", help="comma-separated entries not to run again: their files from an "
                   "earlier run in the same --work are rendered (with that run's wall time)")
    p.add_argument("--out", help="the page to write (default: docs/benchmarks.md of the checkout)")
    p.add_argument("--list", action="store_true", help="list the entries and their commands")
    args = p.parse_args(argv)
    if args.list:
        for e in ENTRIES:
            print(f"{e.name:<18}{' (full-only)' if e.full_only else '':<13} {shown(e)}")
        return 0
    run = selected(args)
    machine = machine_line()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="kvroute-benchmarks-"))
    work.mkdir(parents=True, exist_ok=True)
    outcomes = run_all(run, work, {n.strip() for n in args.reuse.split(",") if n.strip()})
    out = pathlib.Path(args.out) if args.out else root() / "docs" / "benchmarks.md"
    if args.only and out.exists():  # the named entries' sections replaced, the rest kept as they are
        out.write_text(spliced(outcomes, argv, machine, out.read_text()))
    else:
        out.write_text(page(outcomes, argv, machine))
    print(f"wrote {out} (work files in {work})", file=sys.stderr)
    return 0 if all(o is None or o["ok"] for o in outcomes.values()) else 1


def run_all(run: list[Entry], work: pathlib.Path, reuse: set[str]) -> dict[str, dict | None]:
    """Each entry of `run` run (or, named in `reuse`, read back from an earlier run in `work`); every entry's
    outcome, None for those not run."""
    outcomes: dict[str, dict | None] = {e.name: None for e in ENTRIES}
    ran = work / "outcomes.json"  # each entry's wall time and exit code, for --reuse
    earlier = json.loads(ran.read_text()) if ran.exists() else {}
    for i, entry in enumerate(run, 1):
        if entry.name in reuse and entry.name in earlier:
            outcomes[entry.name] = reused(entry, work, earlier[entry.name])
            print(f"[{i}/{len(run)}] {entry.name}: reused from {work}", file=sys.stderr, flush=True)
            continue
        print(f"[{i}/{len(run)}] {entry.name}: {shown(entry)}", file=sys.stderr, flush=True)
        o = outcomes[entry.name] = run_entry(entry, work)
        earlier[entry.name] = {k: o.get(k) for k in ("ok", "seconds", "returncode", "error")}
        ran.write_text(json.dumps(earlier, indent=1))
        print(f"[{i}/{len(run)}] {entry.name}: {'done' if o['ok'] else 'FAILED'} in {o['seconds']:.1f} s",
              file=sys.stderr, flush=True)
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
