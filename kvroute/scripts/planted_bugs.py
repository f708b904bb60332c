"""Plant small, plausible bugs one at a time and see which tests catch each (docs/mutation.md).

    python -m kvroute.scripts.planted_bugs --list                    # the bugs: name, class, file:line, what
    python -m kvroute.scripts.planted_bugs --rev main --out b.json   # every bug against the suite as main has it
    python -m kvroute.scripts.planted_bugs --named --out a.json      # each bug against the tests for its class
    python -m kvroute.scripts.planted_bugs NAME ... --tests tests/unit/test_audit_sim_charges.py
    python -m kvroute.scripts.planted_bugs --table b.json a.json     # the markdown table of two runs

The bugs are kvroute/scripts/planted_bugs.toml's: a piece of one file that occurs there once and what it
becomes, the class of mistake, and the tests written for that class. Each runs in a scratch copy
of the tree (`--work`, default /tmp/kvroute-planted: the working tree's tracked and
untracked-but-not-ignored files and the built C hash chain, as kvroute/benchmarks/compiled_decision.py copies
them, or with `--rev` that revision's files): the file is changed, pytest runs from the copy's root
(so the copy's code wins, in subprocesses too) with `-x`, and the file is put back. A bug is caught
when pytest fails (the first failing test is reported) or runs past `--timeout`; it survives when
pytest passes. A control run without any bug comes first: if the tests fail then, nothing is planted.
The whole suite runs tests/unit first, so a caught bug stops early.
Not part of CI: a bug that survives costs a whole run of the suite (minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import tomllib

from kvroute.benchmarks.checkout import root
from kvroute.benchmarks.compiled_decision import copy_tree
from kvroute.benchmarks.results import write_json

TABLE = pathlib.Path(__file__).resolve().parent / "planted_bugs.toml"
FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)  # pytest -rfE: "FAILED id - why"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bug:
    name: str
    klass: str  # the class of mistake (rate, streak, scheduler, charges, ...)
    path: str
    old: str  # occurs exactly once in `path`
    new: str
    what: str
    tests: tuple[str, ...] = ()  # the tests written to catch its class of mistake


def load_bugs(path: pathlib.Path = TABLE) -> list[Bug]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    by_class = data.get("tests", {})
    return [Bug(name=name, klass=b["class"], path=b["path"], old=b["old"], new=b["new"], what=b["what"],
                tests=tuple(b.get("tests", by_class.get(b["class"], ())))) for name, b in data["bug"].items()]


def line_of(bug: Bug, tree: pathlib.Path | None = None) -> int:
    """The line where the bug's piece of code starts; ValueError if it is not there exactly once."""
    text = ((tree or root()) / bug.path).read_text(encoding="utf-8")
    if text.count(bug.old) != 1:
        raise ValueError(f"{bug.name}: the code to change occurs {text.count(bug.old)} times in {bug.path}")
    return text[: text.index(bug.old)].count("\n") + 1


def run_pytest(work: pathlib.Path, tests: list[str], timeout_s: float) -> tuple[str, str, float]:
    """(outcome: "caught" | "survived" | "timeout", the first failing test or "", wall seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rfE", *tests]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", "", time.monotonic() - start
    wall = time.monotonic() - start
    if proc.returncode == 0:
        return "survived", "", wall
    failed = FAILED.search(out)
    return "caught", failed.group(1) if failed else f"pytest exit {proc.returncode}", wall


def plant(bug: Bug, work: pathlib.Path, tests: list[str], timeout_s: float) -> dict:
    path = work / bug.path
    original = path.read_text(encoding="utf-8")
    line = line_of(bug, work)
    path.write_text(original.replace(bug.old, bug.new), encoding="utf-8")
    try:
        outcome, test, wall = run_pytest(work, tests, timeout_s)
    finally:
        path.write_text(original, encoding="utf-8")
    return {"name": bug.name, "class": bug.klass, "where": f"{bug.path}:{line}", "what": bug.what,
            "outcome": outcome, "test": test, "wall_s": round(wall, 1), "tests": tests}


def checkout(rev: str, work: pathlib.Path) -> None:
    """Replace the scratch copy's files with `rev`'s (the built C hash chain stays)."""
    for path in work.rglob("*"):
        if path.is_file() and path.suffix != ".so":
            path.unlink()
    archive = subprocess.run(["git", "archive", rev], cwd=root(), check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)


def rows_of(files: str) -> list[dict]:
    """The rows of comma-separated --out files, one per bug (the last file's row of a bug wins), in order."""
    rows: dict[str, dict] = {}
    for name in files.split(","):
        rows.update((r["name"], r) for r in json.loads(pathlib.Path(name).read_text()))
    return list(rows.values())


def table(before: list[dict], after: list[dict]) -> str:
    """One row per bug of `before`: where, what, which test caught it in each run (or that it survived)."""
    later = {r["name"]: r for r in after}

    def verdict(row: dict | None) -> str:
        if row is None:
            return "not run"
        if row["outcome"] == "survived":
            return "**survived**"
        return "timed out" if row["outcome"] == "timeout" else f"`{row['test'].removeprefix('tests/')}`"

    lines = ["| bug | class | where | caught before | caught after |", "|---|---|---|---|---|"]
    for r in before:
        lines.append(f"| {r['name']}: {r['what']} | {r['class']} | `{r['where']}` | {verdict(r)} | "
                     f"{verdict(later.get(r['name']))} |")
    survived = sum(r["outcome"] == "survived" for r in before)
    lines.append(f"\n{len(before) - survived} of {len(before)} caught before, "
                 f"{sum(later.get(r['name'], {}).get('outcome') not in (None, 'survived') for r in before)} after.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="bugs to plant (default: every one)")
    p.add_argument("--list", action="store_true", help="print the bugs, plant nothing")
    p.add_argument("--tests", nargs="+", default=["tests/unit", "tests/process"],
                   help="what pytest runs (default: the whole suite, in-process tests first)")
    p.add_argument("--named", action="store_true", help="run each bug against the tests named for it instead")
    p.add_argument("--work", default="/tmp/kvroute-planted", help="the scratch copy of the tree")
    p.add_argument("--rev", help="plant in this git revision's tree instead of the working tree (e.g. the "
                                 "suite before its tests for these bugs: main)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one pytest run may take")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="print the markdown table of two runs' --out files (e.g. --rev main, then --named); "
                        "each may be several files joined by commas, a later row of a bug replacing an earlier one")
    args = p.parse_args(argv)
    if args.table:
        print(table(*(rows_of(files) for files in args.table)))
        return 0
    bugs_all = load_bugs()
    by_name = {b.name: b for b in bugs_all}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        p.error(f"unknown bugs: {', '.join(unknown)} (see --list)")
    bugs = [by_name[n] for n in args.names] if args.names else bugs_all
    if args.list:
        for b in bugs:
            print(f"{b.name:36s} {b.klass:10s} {b.path}:{line_of(b)}  {b.what}")
        return 0
    work = pathlib.Path(args.work)
    copy_tree(str(work))
    if args.rev:
        checkout(args.rev, work)
    control(work, sorted({t for b in bugs for t in b.tests}) if args.named else args.tests, args.timeout)
    rows = run_all(bugs, work, None if args.named else args.tests, args.timeout, args.out)
    print(f"{sum(r['outcome'] != 'survived' for r in rows)} of {len(rows)} caught")
    return 0


def control(work: pathlib.Path, tests: list[str], timeout_s: float) -> None:
    """The tests pass with no bug planted, or nothing they say about a bug means anything: exit."""
    outcome, test, wall = run_pytest(work, tests, timeout_s)
    if outcome != "survived":
        raise SystemExit(f"planted_bugs: the tests fail with no bug planted ({outcome}: {test or 'see pytest'}); "
                         f"fix that first")
    print(f"{'(no bug: control)':36s} passes   {wall:7.1f} s", flush=True)


def run_all(bugs: list[Bug], work: pathlib.Path, tests: list[str] | None, timeout_s: float,
            out: str | None) -> list[dict]:
    """Each bug planted alone against `tests` (None: the tests named for it); rows printed and saved as they come."""
    rows = []
    for bug in bugs:
        row = plant(bug, work, list(bug.tests) if tests is None else tests, timeout_s)
        rows.append(row)
        print(f"{row['name']:36s} {row['outcome']:8s} {row['wall_s']:7.1f} s  {row['test']}", flush=True)
        write_json(out, rows)
    return rows


if __name__ == "__main__":
    sys.exit(main())
