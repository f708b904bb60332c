"""The repository checkout a tool runs from: its root, its commit, a scratch copy of its files.

Tools that work on the source tree (the mypyc probe, mutation testing, the benchmarks page) need
the checkout kvroute was imported from, not the current directory: `root()` finds it from this
file, so they run from any directory, and says so in one line when kvroute is an installed wheel.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import kvroute


def root() -> pathlib.Path:
    """The repository root holding the kvroute package imported now; ValueError when it is not a checkout."""
    top = pathlib.Path(kvroute.__file__).resolve().parents[1]
    if not (top / "pyproject.toml").is_file() or not (top / "router").is_dir():
        raise ValueError(f"kvroute at {top} is not a repository checkout (no pyproject.toml and router/ there)")
    return top


def git(*args: str) -> str:
    """`git ARGS` in the checkout, its output stripped ('' without git or outside a repository)."""
    try:
        return subprocess.run(["git", *args], cwd=root(), capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ""


def scratch_copy(dest: pathlib.Path) -> None:
    """The working tree's files (tracked, and untracked ones git does not ignore) under `dest`."""
    top = root()
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=top, check=True,
                           capture_output=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, names):
        src = top / name
        if src.is_symlink():  # kvroute/router -> ../router: the link itself, as the tree has it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).symlink_to(src.readlink())
        elif src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
