"""Every benchmark and script starts from any directory: `python -m kvroute.<package>.<name> --help`, run
from an empty temporary directory, answers with its usage and exits 0 (an import that a refactor broke, a
path taken relative to the repository root, or a script that takes `--help` for a path fails here rather
than in a user's hands)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("benchmarks", "scripts")


def commands() -> list[str]:
    """kvroute.<package>.<name> of every module or subpackage there that runs as a command, and the packages'
    own listing (kvroute.benchmarks)."""
    found = []
    for package in PACKAGES:
        folder = ROOT / "kvroute" / package
        if (folder / "__main__.py").is_file():
            found.append(f"kvroute.{package}")
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__main__.py").is_file():
                found.append(f"kvroute.{package}.{path.name}")
            elif path.suffix == ".py" and path.name != "__main__.py" and \
                    'if __name__ == "__main__":' in path.read_text():
                found.append(f"kvroute.{package}.{path.stem}")
    return found


def test_every_benchmark_and_script_answers_help_from_any_directory(tmp_path):
    names = commands()
    assert len(names) >= 20 and "kvroute.benchmarks.gpu_check" in names and "kvroute.scripts.benchmarks_page" in names
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's code, from a directory that is not it
    procs = {name: subprocess.Popen([sys.executable, "-m", name, "--help"], cwd=tmp_path, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in names}
    failed = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"python -m {name} --help did not return")
        if proc.returncode != 0 or b"usage" not in out.lower():
            failed[name] = err.decode(errors="replace").strip().splitlines()[-1:] or out[:200]
    assert not failed, failed
    assert not list(tmp_path.iterdir()), "a --help wrote files"
