"""Where a benchmark's figures go: the JSON file named by its --out (nothing without one; `reps_parser`
gives a repeated measurement its --reps and --out), or a directory of runs (`runs_parser`)."""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any


def write_json(path: str | None, result: Any) -> None:
    if path:
        pathlib.Path(path).write_text(json.dumps(result, indent=2) + "\n")


def reps_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a benchmark that repeats its measurement --reps times and writes its figures to --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None)
    return parser


def runs_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a benchmark that writes its runs under OUT and can reprint their table (--table-only)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path, help="where the runs go (created; existing runs are replaced)")
    parser.add_argument("--table-only", action="store_true", help="print the table of the runs already in OUT")
    return parser
