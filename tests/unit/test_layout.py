"""The repository's layout rules, read from the source with `ast` (nothing is imported; the graph is
tests/support/import_graph.py's).

- no import cycle among the project's modules, and none among its packages (a folder under router/, engine/,
  loadgen/, or kvroute/benchmarks, kvroute/scripts: two packages that import each other through different
  modules are a cycle too);
- packages point one way (PACKAGE_RULES): the fleet never imports the router service, the event feeds or the
  planner; the engine's core, tiers and transfer never import what sits above them; the three programs never
  import the benchmarks, the scripts or the command;
- engine/ takes only router.contract from the router; loadgen/ takes router.contract,
  router.decision, router.index and router.planner; router.contract takes nothing else of
  the project;
- router/ stays a few packages (at most MAX_ROUTER_ENTRIES modules and subpackages at its top);
- no file cites a file outside the repository; nothing edits sys.path.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess

from tests.support.import_graph import (
    GRAPH,
    PACKAGES,
    ROOT,
    cycles,
    import_nodes,
    package_graph,
    package_of,
    targets,
)

ENGINE_MAY_USE = ("kvroute.router.contract",)
LOADGEN_MAY_USE = ("kvroute.router.contract", "kvroute.router.decision", "kvroute.router.index",
                   "kvroute.router.planner")
TOOLS = ("kvroute.benchmarks", "kvroute.scripts", "kvroute.cli", "kvroute.__main__")  # on top of everything
# package -> what it must never import (docs/architecture.md#dependency-rule), beyond "no cycle"
PACKAGE_RULES = {
    "kvroute.router.fleet": ("kvroute.router.service", "kvroute.router.kvevents", "kvroute.router.planner"),
    "kvroute.router.kvevents": ("kvroute.router.service", "kvroute.router.planner"),
    "kvroute.router.planner": ("kvroute.router.service", "kvroute.router.kvevents"),
    "kvroute.engine.core": ("kvroute.engine.kv", "kvroute.engine.runners", "kvroute.engine.transfer",
                            "kvroute.engine.service", "kvroute.engine.config"),
    "kvroute.engine.kv": ("kvroute.engine.runners", "kvroute.engine.transfer", "kvroute.engine.service",
                          "kvroute.engine.config"),
    "kvroute.engine.runners": ("kvroute.engine.transfer", "kvroute.engine.service", "kvroute.engine.config"),
    "kvroute.engine.transfer": ("kvroute.engine.service", "kvroute.engine.runners"),
    "kvroute.benchmarks": ("kvroute.scripts",),
    **{f"kvroute.{p}": TOOLS for p in PACKAGES},
}
MAX_ROUTER_ENTRIES = 15
OUTSIDE_CITATIONS = ("DESIGN" + ".md", "../" + "shared", "/work/" + "shared")


def _crossings(prefix: str, allowed: tuple[str, ...], into: str = "kvroute.router") -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if m == prefix or m.startswith(prefix + ".")
                  for t in targets if (t == into or t.startswith(into + "."))
                  and not any(t == a or t.startswith(a + ".") for a in allowed))


def test_the_graph_sees_the_project():
    assert {"kvroute.router.service.app", "kvroute.engine.service.llm_engine", "kvroute.loadgen.sim.runner",
            "kvroute.cli", "kvroute.benchmarks.router.latency", "kvroute.scripts.benchmarks_page.page"} <= set(GRAPH)
    assert "kvroute.router.fleet.cluster" in GRAPH["kvroute.router.service.app"]
    assert "kvroute.loadgen.processes" in GRAPH["kvroute.benchmarks.router.latency"]
    assert package_of("kvroute.router.fleet.kinds.vllm") == "kvroute.router.fleet"
    assert package_of("kvroute.engine.config") == "kvroute.engine.config"  # a module at the top: its own node
    assert package_of("kvroute.benchmarks.gpu_check.check") == "kvroute.benchmarks"


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_do_not_count_but_function_level_ones_do():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kvroute.router.service.app\n"
                     "else:\n    import kvroute.router.fleet.cluster\n"
                     "def f():\n    from kvroute.router.index import base\n")
    found = set().union(*(targets("kvroute.router.service.admin", n) for n in import_nodes(tree)))
    assert found == {"kvroute.router.fleet.cluster", "kvroute.router.index", "kvroute.router.index.base"}


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_package_cycle_is_found_where_no_module_cycle_is():
    graph = {"kvroute.router.fleet.a": {"kvroute.router.service.b"}, "kvroute.router.service.b": set(),
             "kvroute.router.service.c": {"kvroute.router.fleet.d"}, "kvroute.router.fleet.d": set()}
    assert cycles(graph) == []
    packages, why = package_graph(graph)
    assert cycles(packages) == [["kvroute.router.fleet", "kvroute.router.service", "kvroute.router.fleet"]]
    edge = ("kvroute.router.service", "kvroute.router.fleet")
    assert why[edge] == ["kvroute.router.service.c -> kvroute.router.fleet.d"]


def test_no_package_cycle():
    packages, why = package_graph(GRAPH)
    found = cycles(packages)
    lines = []
    for cycle in found:
        lines.append(" -> ".join(cycle))
        lines += [f"    {edge}" for a, b in zip(cycle, cycle[1:]) for edge in sorted(why[a, b])[:5]]
    assert not found, "package cycles (and module imports that make them):\n" + "\n".join(lines)


def test_packages_point_one_way():
    """The fleet never imports the router service (nor the feeds or the planner above it); the engine's parts
    never import what sits above them; the programs never import the benchmarks, scripts or command."""
    found = sorted(f"{m} -> {t}" for m, imported in GRAPH.items() for t in imported
                   if any(t == f or t.startswith(f + ".") for f in PACKAGE_RULES.get(package_of(m), ())))
    assert not found, "imports against the package order:\n" + "\n".join(found)


def test_engine_takes_only_the_contract_from_the_router():
    crossings = _crossings("kvroute.engine", ENGINE_MAY_USE)
    assert not crossings, "engine/ may import only router.contract from router:\n" + "\n".join(crossings)


def test_the_contract_takes_nothing_else_of_the_project():
    crossings = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if m.startswith("kvroute.router.contract")
                       for t in targets if not t.startswith("kvroute.router.contract"))
    assert not crossings, "router.contract imports other project modules:\n" + "\n".join(crossings)


def test_loadgen_takes_only_the_shared_router_layers():
    crossings = _crossings("kvroute.loadgen", LOADGEN_MAY_USE)
    assert not crossings, f"loadgen/ may import from router only {', '.join(LOADGEN_MAY_USE)}:\n" + "\n".join(
        crossings)


def test_router_has_few_top_level_modules():
    entries = sorted(p.name for p in (ROOT / "router").iterdir()
                     if (p.suffix == ".py" and p.is_file()) or (p.is_dir() and (p / "__init__.py").exists()))
    assert len(entries) <= MAX_ROUTER_ENTRIES, f"router/ has {len(entries)} top-level entries: {entries}"


def _repository_files() -> list[pathlib.Path]:
    """Tracked and untracked files (not ignored ones); without git, every file but the usual clutter."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True, timeout=30).stdout
        return [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        pass
    skip = {".git", "__pycache__", ".pytest_cache", ".venv", "build", "dist", "results", "out"}
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        files += [pathlib.Path(folder, n) for n in names]
    return files


def test_no_file_cites_one_outside_the_repository():
    found = []
    for path in _repository_files():
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for needle in OUTSIDE_CITATIONS:
                if needle in line:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "citations of files outside the repository:\n" + "\n".join(sorted(set(found)))


def test_no_test_file_imports_another():
    """Shared test helpers live in tests/support; test files and conftest import only from there."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "support" in path.relative_to(ROOT / "tests").parts:
            continue
        for node in import_nodes(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                      if n.startswith("tests.") and not n.startswith("tests.support")]
    assert not found, "test files importing other test files:\n" + "\n".join(found)


def test_everything_imports_the_project_as_kvroute():
    """One import name: `router`, `engine` and `loadgen` are folders, never top-level modules."""
    found = []
    for path in _repository_files():
        if path.suffix != ".py" or not path.is_file() or path.relative_to(ROOT).parts[0] == "kvroute":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert not found, "import these as kvroute.<package>:\n" + "\n".join(found)


def test_the_kvroute_package_links_the_top_level_folders():
    for package in PACKAGES:
        link = ROOT / "kvroute" / package
        assert link.is_symlink() and link.resolve() == (ROOT / package).resolve(), link


def _edits_sys_path(node: ast.AST) -> bool:
    """`sys.path.insert/append/extend(...)` or an assignment to `sys.path` (or an item of it)."""
    def is_sys_path(n: ast.AST) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
                and n.value.id == "sys")

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value)
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets)
    return False


def test_nothing_edits_sys_path():
    """Every command, benchmark and script imports the project as the package it is (`python -m kvroute...`),
    from any directory: none finds it by editing the import path."""
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, '.')").body[1].value)
    found = []
    for path in _repository_files():
        if path.suffix != ".py" or not path.is_file() or path.relative_to(ROOT).parts[0] == "kvroute" and \
                path.relative_to(ROOT).parts[1] in PACKAGES:
            continue
        found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text(), str(path)))
                  if _edits_sys_path(n)]
    assert not found, "sys.path edited at:\n" + "\n".join(found)
    assert not (ROOT / "tools").exists(), "benchmarks live in kvroute/benchmarks, generators in kvroute/scripts"
