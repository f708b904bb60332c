"""Mutation score per module: mutmut over the modules where a silent bug costs most.

    python -m kvroute.scripts.mutation                # every module in [tool.kvroute.mutation.modules]
    python -m kvroute.scripts.mutation router/contract/limits.py router/contract/kv_auth.py
    python -m kvroute.scripts.mutation --list         # the modules and the tests each one runs

Each module runs on its own, with only the tests named for it in pyproject.toml
([tool.kvroute.mutation.modules]: module -> test files or node ids, or a table
{tests = [...], args = [...], timeout_multiplier = X} whose args, e.g. ["-k", "memory"], go to
every pytest run and whose timeout_multiplier replaces the default 4),
in a scratch copy of the tree (`git ls-files`, tracked and untracked-but-not-ignored) whose
pyproject.toml gets a [tool.mutmut] section for that module alone; mutmut's own [tool.mutmut]
in pyproject.toml (every module, every listed unit test) still serves a plain `mutmut run`.
It prints, per module, the mutants mutmut made and how they ended (killed, survived,
timeout, no tests), the score (killed + timeout) / all judged, the run's wall time and
the CPU seconds of mutmut and its workers, a total, then the surviving mutants' names;
`mutmut show NAME` in the module's scratch directory prints one.
Needs `pip install mutmut` (3.x); not part of CI (docs/mutation.md has the scores).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from typing import Any

from kvroute.benchmarks.checkout import root, scratch_copy

KILLED, SURVIVED, TIMEOUT = {1, 3}, {0}, {24, -24, 36, 152, 255}
WALL = "kvroute-mutation-wall-s"  # seconds the module's whole mutmut run took
TIMEOUT_MULTIPLIER = 4.0


def modules_config(pyproject: pathlib.Path) -> dict[str, dict]:
    """module -> {"tests": test files or node ids, "args": extra pytest arguments (e.g. -k EXPR),
    "timeout_multiplier": mutmut's, for this module}."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    out = {}
    for module, value in data["tool"]["kvroute"]["mutation"]["modules"].items():
        spec: dict[str, Any] = {"tests": value} if isinstance(value, list) else dict(value)
        out[module] = {"tests": list(spec["tests"]), "args": list(spec.get("args", [])),
                       "timeout_multiplier": float(spec.get("timeout_multiplier", TIMEOUT_MULTIPLIER))}
    return out


def mutmut_section(module: str, tests: list[str], extra_args: list[str],
                   timeout_multiplier: float = TIMEOUT_MULTIPLIER) -> str:
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return ("\n[tool.mutmut]\n"
            f"source_paths = {toml_list(['router', 'engine', 'loadgen'])}\n"
            f"also_copy = {toml_list(['kvroute'])}\n"
            f"only_mutate = {toml_list([module])}\n"
            f"pytest_add_cli_args = {toml_list(['-q', '-p', 'no:cacheprovider', *extra_args])}\n"
            f"pytest_add_cli_args_test_selection = {toml_list(tests)}\n"
            # a mutant that hangs is stopped after 4 x (its tests' time + 1 s) of wall (x 2 of CPU),
            # not mutmut's default 15 x: the tests here take well under a second of CPU each
            f"timeout_multiplier = {timeout_multiplier}\n")


def without_mutmut_section(text: str) -> str:
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            out.append(line)
    return "".join(out)


def tally(workdir: pathlib.Path, module: str) -> tuple[collections.Counter, list[str]]:
    meta = workdir / "mutants" / (module + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    counts: collections.Counter[str] = collections.Counter()
    survivors: list[str] = []
    for name, code in sorted(codes.items()):
        if code in KILLED:
            counts["killed"] += 1
        elif code in SURVIVED:
            counts["survived"] += 1
            survivors.append(name)
        elif code in TIMEOUT:
            counts["timeout"] += 1
        elif code in (5, 33):
            counts["no tests"] += 1
            survivors.append(name + " (no tests)")
        else:
            counts[f"other ({code})"] += 1
    return counts, survivors


def score(counts: collections.Counter) -> float | None:
    judged = counts["killed"] + counts["survived"] + counts["timeout"] + counts["no tests"]
    return (counts["killed"] + counts["timeout"]) / judged if judged else None


def run_module(module: str, spec: dict, workdir: pathlib.Path, children: int, extra: list[str]) -> int:
    scratch_copy(workdir)
    pyproject = workdir / "pyproject.toml"
    section = mutmut_section(module, spec["tests"], spec["args"] + extra, spec["timeout_multiplier"])
    pyproject.write_text(without_mutmut_section(pyproject.read_text()) + section)
    mutmut = shutil.which("mutmut") or str(pathlib.Path(sys.executable).with_name("mutmut"))
    start, cpu = time.monotonic(), children_cpu_s()
    rc = subprocess.run([mutmut, "run", "--max-children", str(children)], cwd=workdir).returncode
    (workdir / WALL).write_text(f"{time.monotonic() - start:.1f} {children_cpu_s() - cpu:.1f}\n")
    return rc


def children_cpu_s() -> float:
    """User + system CPU seconds of every finished child process (mutmut and the workers it forked)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall_of(workdir: pathlib.Path) -> tuple[float, float] | None:
    """(wall seconds, CPU seconds) of the module's last run."""
    path = workdir / WALL
    if not path.exists():
        return None
    wall, _, cpu = path.read_text().strip().partition(" ")
    return float(wall), float(cpu or "nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help="modules to score (default: every configured module)")
    p.add_argument("--list", action="store_true", help="print the modules and their tests, run nothing")
    p.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    p.add_argument("--workdir", default="/tmp/kvroute-mutation", help="scratch copies go here, one per module")
    p.add_argument("--report-only", action="store_true", help="tally the results already in --workdir")
    p.add_argument("--pytest-arg", action="append", default=[], help="extra pytest argument (repeatable)")
    args = p.parse_args(argv)
    config = modules_config(root() / "pyproject.toml")
    modules = args.modules or list(config)
    unknown = [m for m in modules if m not in config]
    if unknown:
        p.error(f"not configured in [tool.kvroute.mutation.modules]: {', '.join(unknown)}")
    if args.list:
        for m in modules:
            multiplier = config[m]["timeout_multiplier"]
            timeout = "" if multiplier == TIMEOUT_MULTIPLIER else f" (timeout_multiplier {multiplier:g})"
            print(f"{m}: {' '.join(config[m]['args'] + config[m]['tests'])}{timeout}")
        return 0
    rows = []
    for module in modules:
        workdir = pathlib.Path(args.workdir) / module.replace("/", "_").removesuffix(".py")
        if not args.report_only:
            rc = run_module(module, config[module], workdir, args.max_children, args.pytest_arg)
            if rc:
                print(f"mutation: mutmut run for {module} exited {rc}", file=sys.stderr)
        rows.append((module, workdir, *tally(workdir, module)))
    print(f"\n{'module':44s} {'mutants':>7s} {'killed':>6s} {'survived':>8s} {'timeout':>7s} {'no tests':>8s} "
          f"{'score':>6s} {'wall':>6s} {'cpu':>6s}")
    total_wall = total_cpu = 0.0
    for module, workdir, counts, _ in rows:
        s, times = score(counts), wall_of(workdir)
        wall, cpu = times or (0.0, 0.0)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        print(f"{module:44s} {sum(counts.values()):7d} {counts['killed']:6d} {counts['survived']:8d} "
              f"{counts['timeout']:7d} {counts['no tests']:8d} {'-' if s is None else f'{s:.1%}':>6s} "
              f"{'-' if times is None else f'{wall:.0f} s':>6s} {'-' if times is None else f'{cpu:.0f} s':>6s}")
    print(f"{'total':44s} {'':7s} {'':6s} {'':8s} {'':7s} {'':8s} {'':6s} {total_wall:4.0f} s {total_cpu:4.0f} s")
    for module, workdir, _, survivors in rows:
        if survivors:
            print(f"\nsurviving in {module} (mutmut show NAME, in {workdir}):")
            print("\n".join(f"  {name}" for name in survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
