"""The project's import graph, read from the source with `ast` (nothing is imported): modules, the project
modules each one imports (imports inside functions count; those under `if TYPE_CHECKING:` do not: they never
run), the packages they fall in, and the cycles of a graph. tests/unit/test_layout.py holds the rules on it."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("router", "engine", "loadgen")  # folders at the top; they import as kvroute.router, ...
TOP_MODULES = ("kvroute", "kvroute.cli", "kvroute.__main__")  # kvroute/ itself: the package and the command
TOOL_PACKAGES = ("benchmarks", "scripts")  # real folders in kvroute/, above the three programs


def module_files() -> dict[str, pathlib.Path]:
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
    for package in TOOL_PACKAGES:
        for path in sorted((ROOT / "kvroute" / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


MODULES = module_files()


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(node: ast.AST):
    """Every import statement under `node`, at any depth, except those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and is_type_checking(child.test):
            for stmt in child.orelse:
                yield from import_nodes_of(stmt)
            continue
        yield from import_nodes_of(child)


def import_nodes_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from import_nodes(node)


def resolve(name: str) -> str | None:
    """The project module `name` lands in (its longest prefix that is a module), else None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def base_of(module: str, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Project modules that running `node` (in `module`) imports. `from X import n` counts X
    itself, and X.n too when that is a module."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = base_of(module, node)
        names = [base] + [f"{base}.{a.name}" for a in node.names] if base else []
    found = {resolve(n) for n in names if n.split(".")[0] == "kvroute"}
    return {t for t in found if t is not None and t != module}


def graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = set().union(*(targets(module, n) for n in import_nodes(tree)))
    return graph


GRAPH = graph()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    return [cycle_in(graph, c) for c in components]


def cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
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


def package_of(module: str) -> str:
    """The package a module falls in, for the package-level rules: a folder under router/, engine/ or loadgen/
    (kvroute.router.fleet, kvroute.engine.kv, kvroute.loadgen.sim; its subfolders included), kvroute.benchmarks
    or kvroute.scripts; a module directly in router/, engine/, loadgen/ or kvroute/ (the engine's config,
    loadgen's commands, kvroute.cli) is a node of its own."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] in PACKAGES and (ROOT / parts[1] / parts[2]).is_dir():
        return ".".join(parts[:3])
    if len(parts) >= 2 and parts[1] in TOOL_PACKAGES:
        return ".".join(parts[:2])
    return module


def package_graph(graph: dict[str, set[str]], of=package_of
                  ) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """The graph of packages (`of(module)`), and for each package edge the module imports that make it."""
    packages: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, imported in graph.items():
        a = of(module)
        packages.setdefault(a, set())
        for target in imported:
            b = of(target)
            packages.setdefault(b, set())
            if a != b:
                packages[a].add(b)
                why.setdefault((a, b), []).append(f"{module} -> {target}")
    return packages, why
