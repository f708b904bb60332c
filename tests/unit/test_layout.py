"""The repository's layout rules, read from the source with `ast` (nothing is imported).

- no import cycle among the project's modules (imports inside functions count; those under
  `if TYPE_CHECKING:` do not: they never run);
- engine/ takes only router.contract from the router; loadgen/ takes router.contract,
  router.decision, router.index and router.planner; router.contract takes nothing else of
  the project;
- router/ stays a few packages (at most MAX_ROUTER_ENTRIES modules and subpackages at its top);
- no file cites a file outside the repository.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("router", "engine", "loadgen")  # folders at the top; they import as kvroute.router, ...
TOP_MODULES = ("kvroute", "kvroute.cli", "kvroute.__main__")  # kvroute/ itself: the package and the command
ENGINE_MAY_USE = ("kvroute.router.contract",)
LOADGEN_MAY_USE = ("kvroute.router.contract", "kvroute.router.decision", "kvroute.router.index", "kvroute.router.planner")
MAX_ROUTER_ENTRIES = 15
OUTSIDE_CITATIONS = ("DESIGN" + ".md", "../" + "shared", "/work/" + "shared")


def _module_files() -> dict[str, pathlib.Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(["kvroute", *parts])] = path
    for name in TOP_MODULES:
        parts = name.split(".")[1:] or ["__init__"]
        mods[name] = ROOT.joinpath("kvroute", *parts).with_suffix(".py")
    return mods


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every import statement under `node`, at any depth, except those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _import_nodes_of(stmt)
            continue
        yield from _import_nodes_of(child)


def _import_nodes_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _import_nodes(node)


def _resolve(name: str) -> str | None:
    """The project module `name` lands in (its longest prefix that is a module), else None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _base_of(module: str, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Project modules that running `node` (in `module`) imports. `from X import n` counts X
    itself, and X.n too when that is a module."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = _base_of(module, node)
        names = [base] + [f"{base}.{a.name}" for a in node.names] if base else []
    found = {_resolve(n) for n in names if n.split(".")[0] == "kvroute"}
    return {t for t in found if t is not None and t != module}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = set().union(*(_targets(module, n) for n in _import_nodes(tree)))
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that comes back to its start) per strongly connected component of 2+."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred modules, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, c) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest way from the component's first module back to itself (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # cannot happen in a strongly connected component


def _crossings(prefix: str, allowed: tuple[str, ...], into: str = "kvroute.router") -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if m == prefix or m.startswith(prefix + ".")
                  for t in targets if (t == into or t.startswith(into + "."))
                  and not any(t == a or t.startswith(a + ".") for a in allowed))


def test_the_graph_sees_the_project():
    assert {"kvroute.router.service.app", "kvroute.engine.service.llm_engine", "kvroute.loadgen.sim.runner", "kvroute.cli"} <= set(GRAPH)
    assert "kvroute.router.fleet.cluster" in GRAPH["kvroute.router.service.app"]


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_do_not_count_but_function_level_ones_do():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kvroute.router.service.app\n"
                     "else:\n    import kvroute.router.fleet.cluster\n"
                     "def f():\n    from kvroute.router.index import base\n")
    found = set().union(*(_targets("kvroute.router.service.admin", n) for n in _import_nodes(tree)))
    assert found == {"kvroute.router.fleet.cluster", "kvroute.router.index", "kvroute.router.index.base"}


def test_no_import_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


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
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
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
