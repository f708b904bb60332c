"""`--out DIR` of the commands that write a run into a directory (loadgen, bench, demo, chaos).

A run never silently replaces an earlier one: a directory that holds anything is refused before
the command starts anything, unless `--force`; then the files this run writes replace those of the
same name and nothing else is removed (a directory is never emptied on a user's behalf).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from kvroute.router.contract.settings import setting

FORCE_HELP = "write into a non-empty --out directory: the run's files replace those of the same name"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForceFlag:
    """output directory"""

    force: bool = setting(False, FORCE_HELP)


def check_out_dir(path: str | os.PathLike[str], force: bool) -> None:
    """ValueError (one line) when `path` is not a directory, or holds anything and `force` is False."""
    out = pathlib.Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {path} exists and is not a directory")
    if not force and out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {path} is not empty (an earlier run?); add --force to write over it, "
                         "or choose another directory")
