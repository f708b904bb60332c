"""What compiling the routing decision with mypyc buys: the same code, compiled, measured against itself.

    python -m kvroute.benchmarks.compiled_decision [--out compiled_decision.json] [--latency] [--decision]
                                                   [--work DIR]

Copies this working tree to a new or empty work folder, compiles the decision modules there with
mypyc (MODULES: candidates, the route step, kv_aware's and approx_kv's scoring, the memory index),
checks the compiled copy makes the same decisions (tests/unit/test_same_decisions.py and the
sim/router parity test), then runs `python -m kvroute.benchmarks.router instructions` (with
--latency also `latency`) for kvroute's kv_aware and round_robin routers, and with --decision
`decision` (the in-process decision), in this tree and in the compiled copy, one after the other,
and prints the two side by side. The copy is changed only as mypyc needs (CHANGES): the classes
that interpreted code subclasses or patches allow it, and the parameter dataclasses stay plain
Python classes (dataclasses.fields reads them). Needs mypy (`pip install mypy`), a C
compiler and valgrind; nothing in the project's install uses it. docs/router.md reports what it
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from kvroute.benchmarks.checkout import root, scratch_copy
from kvroute.benchmarks.results import write_json

MODULES = (
    "router/decision/base.py", "router/decision/route.py", "router/decision/candidates.py",
    "router/decision/prefix_hashes.py", "router/decision/policies/kv_aware.py", "router/decision/policies/approx_kv.py",
    "router/decision/scoring/kv_cost.py", "router/decision/scoring/recent.py", "router/decision/scoring/reuse.py",
    "router/decision/scoring/replication.py", "router/decision/scoring/hot_spot.py",
    "router/decision/scoring/eviction.py", "router/decision/scoring/rate.py",
    "router/decision/scoring/tier_credit.py", "router/index/base.py", "router/index/memory.py",
    "router/index/holder_maps.py",
)
# module -> (classes interpreted code subclasses or patches, parameter dataclasses kept as Python classes)
CHANGES = {
    "router/decision/base.py": (("PolicyBase",), ()),
    "router/decision/route.py": (("RouteDecision",), ("RouteSettings",)),
    "router/decision/candidates.py": (("LeastLoaded", "RecentSenders"), ()),
    "router/decision/prefix_hashes.py": (("PrefixHashes",), ()),
    "router/decision/policies/kv_aware.py": (("KvAwarePolicy",), ("KvAwareConfig",)),
    "router/decision/policies/approx_kv.py": (("ApproxKvPolicy",), ("ApproxKvConfig",)),
    "router/decision/scoring/kv_cost.py": (("KvCostPolicy",), ("KvCostConfig",)),
    "router/decision/scoring/recent.py": (("RecentBlocks",), ()),
    "router/decision/scoring/reuse.py": (("ReuseHistory",), ()),
    "router/decision/scoring/rate.py": (("PrefillRate",), ("RateConfig",)),
    "router/index/memory.py": (("MemoryIndex",), ()),
}
CHECKS = ("tests/unit/test_same_decisions.py", "tests/unit/test_sim_router_parity.py")
# tests that replace a method on a live object, which a compiled class does not allow
PATCHING = ("test_a_drift_shows",)
ROUTERS = ("kvroute kv_aware", "kvroute round_robin")


def fail(message: str) -> None:
    print(f"compiled_decision: {message}", file=sys.stderr)
    sys.exit(2)


def copy_tree(dest: str) -> None:
    """The working tree (its scratch copy), with the C hash chain as this tree has it built."""
    scratch_copy(pathlib.Path(dest))
    folder = os.path.join(root(), "router/contract")
    for name in os.listdir(folder):
        if name.startswith("_chainhash") and name.endswith(".so"):
            shutil.copy2(os.path.join(folder, name), os.path.join(dest, "router/contract"))


def prepare(dest: str) -> None:
    for rel, (open_classes, plain_classes) in CHANGES.items():
        path = os.path.join(dest, rel)
        with open(path) as f:
            text = f.read()
        for name, attr in [(c, "allow_interpreted_subclasses=True") for c in open_classes] + \
                          [(c, "native_class=False") for c in plain_classes]:
            pattern = rf"^((?:@dataclasses\.dataclass\([^)]*\)\n)?)class {name}\b"
            text, n = re.subn(pattern, rf"@mypyc_attr({attr})\n\1class {name}", text, count=1, flags=re.M)
            if n != 1:
                fail(f"{rel}: class {name} not found")
        text = text.replace("from __future__ import annotations\n",
                            "from __future__ import annotations\n\nfrom mypy_extensions import mypyc_attr\n", 1)
        with open(path, "w") as f:
            f.write(text)


def run(cmd: list[str], cwd: str, what: str) -> str:
    print(f"  {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        fail(f"{what} failed in {cwd}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def bench(tree: str, kind: str, out: str) -> dict[str, dict]:
    """`python -m kvroute.benchmarks.router KIND` run in `tree` (so its code, compiled or not, is imported)."""
    cmd = [sys.executable, "-m", "kvroute.benchmarks.router", kind, "--out", out]
    for name in ROUTERS if kind != "decision" else ():
        cmd += ["--only", name]
    run(cmd, tree, f"{kind} ({'compiled' if tree != str(root()) else 'this tree'})")
    with open(out) as f:
        rows = json.load(f)[kind]
    return {row.get("router") or row.get("target") or row_name(row): row for row in rows}


def row_name(row: dict) -> str:
    return f"{row['scenario']}, {row['index']}, {row['instances']} inst, {row['prompt_tokens']} tok"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="compiled_decision.json")
    ap.add_argument("--latency", action="store_true", help="also run the wall-clock latency bench in both trees")
    ap.add_argument("--decision", action="store_true", help="also run the in-process decision bench in both trees")
    ap.add_argument("--work", default="", help="work folder (default: a new temporary one, removed at the end)")
    args = ap.parse_args(argv)
    check_can_run(args)
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="kvroute-compiled-"))
    kinds = ["instructions"] + (["latency"] if args.latency else []) + (["decision"] if args.decision else [])
    try:
        print(f"compiled copy in {work}", file=sys.stderr)
        result: dict = {"modules": list(MODULES), "checks": compiled_copy(work)}
        for kind in kinds:
            result[kind] = {"this tree": bench(str(root()), kind, os.path.join(work, f"{kind}-python.json")),
                            "compiled": bench(work, kind, os.path.join(work, f"{kind}-compiled.json"))}
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(MODULES)} modules compiled; checks on the compiled copy: {result['checks']}")
    for kind in kinds:
        plain, comp = result[kind]["this tree"], result[kind]["compiled"]
        for name in plain:
            if name in comp:
                print(f"{kind:12} {name:60} python {summary(kind, plain[name]):34} "
                      f"compiled {summary(kind, comp[name])}")
    write_json(args.out, result)
    return 0


def check_can_run(args: argparse.Namespace) -> None:
    """What the run needs, checked before minutes of work rather than after."""
    try:
        root()
    except ValueError as e:
        fail(str(e))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        fail(f"--out {args.out}: cannot write to {out_dir}")
    try:
        import mypyc  # noqa: F401
    except ImportError:
        fail("needs mypyc: pip install mypy")
    if shutil.which("valgrind") is None:
        fail("needs valgrind (the instructions bench counts with callgrind)")
    if args.work and os.path.isdir(args.work) and os.listdir(args.work):  # the copy replaces the folder
        fail(f"--work {args.work}: not empty; name a new or empty folder")


def compiled_copy(work: str) -> str:
    """The tree copied to `work`, its decision modules compiled there and imported from there, and its
    same-decision checks run on it; their summary line."""
    copy_tree(work)
    prepare(work)
    # compiled through the kvroute/ links, so mypyc names them kvroute.router... as the code imports them
    run([sys.executable, "-m", "mypyc", *(f"kvroute/{m}" for m in MODULES)], work, "mypyc")
    names = ["kvroute." + m[:-3].replace("/", ".") for m in MODULES]
    code = f"import importlib; [print(importlib.import_module(n).__file__) for n in {names}]"
    loaded = run([sys.executable, "-c", code], work, "import the compiled modules").split()
    if len(loaded) != len(MODULES) or not all(f.startswith(work) and f.endswith(".so") for f in loaded):
        fail(f"the copy does not import its compiled modules: {loaded}")
    checked = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CHECKS,
                   "-k", " and ".join(f"not {t}" for t in PATCHING)], work, "same decisions, compiled")
    return checked.strip().splitlines()[-1]


def summary(kind: str, row: dict) -> str:
    if kind == "instructions":
        return f"{row['instructions_per_request'] / 1e6:.3f} M instr/request"
    if kind == "decision":
        return f"median {row['median_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms"
    if "cpu_us_per_request_c32" not in row:  # the engine alone
        return f"{row['rps_c32']:.0f} req/s"
    return f"{row['cpu_us_per_request_c32']:.0f} us CPU/request, {row['rps_c32']:.0f} req/s"


if __name__ == "__main__":
    sys.exit(main())
