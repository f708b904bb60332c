"""Write every command's flags table into its docs page, from the declared settings.

    python -m kvroute.scripts.flags_doc           # rewrite the tables (between their markers)
    python -m kvroute.scripts.flags_doc --check   # exit 1 naming each page whose table is out of date

Each `kvroute` subcommand module (kvroute/cli.py SUBCOMMANDS) has a `COMMAND`; one with a `doc`
page gets its table there (router/contract/settings_doc.py).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

from kvroute.cli import SUBCOMMANDS
from kvroute.router.contract.cli_parser import Command
from kvroute.router.contract.settings_doc import with_table

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout (kvroute/benchmarks/checkout.py root())


def commands() -> dict[str, Command]:
    """Every subcommand's declared command, by subcommand name."""
    return {name: importlib.import_module(module).COMMAND for name, (module, _) in SUBCOMMANDS.items()}


def pages(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
    """Each docs page that holds a flags table, with every table in it written from the settings."""
    out: dict[pathlib.Path, str] = {}
    for command in commands().values():
        if command.doc:
            path = root / command.doc
            out[path] = with_table(out.get(path) or path.read_text(encoding="utf-8"), command)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvroute.scripts.flags_doc",
                                     description="Write every command's flags table into its docs page.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each page out of date")
    check = parser.parse_args(argv).check
    stale = []
    for path, text in pages().items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path.relative_to(ROOT)}: {'out of date' if check else 'rewritten'}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
