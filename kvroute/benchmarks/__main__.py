"""`python -m kvroute.benchmarks`: the benchmarks in this package, one line each (nothing is run)."""

from __future__ import annotations

import ast
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def runnable() -> dict[str, str]:
    """name -> the first line of its docstring, for every module or package here that runs as a command."""
    out = {}
    for path in sorted(HERE.iterdir()):
        source = path / "__init__.py" if path.is_dir() else path
        command = (path / "__main__.py").is_file() if path.is_dir() else \
            path.suffix == ".py" and 'if __name__ == "__main__":' in path.read_text()
        if command and path.name != "__main__.py":
            doc = ast.get_docstring(ast.parse(source.read_text())) or ""
            out[path.name.removesuffix(".py")] = doc.splitlines()[0] if doc else ""
    return out


USAGE = "usage: python -m kvroute.benchmarks   (lists them; `python -m kvroute.benchmarks.NAME --help` says more)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv != ["--help"] and argv != ["-h"]:
        print(f"{USAGE}\nkvroute.benchmarks: takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return 2
    if argv:
        print(USAGE + "\n")
    for name, line in runnable().items():
        print(f"python -m kvroute.benchmarks.{name:<22} {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
