"""Every script in tools/ starts: `--help` answers with its usage and exits 0 (an import that a
refactor broke, or a script that takes `--help` for a path, fails here rather than in a user's hands)."""

import os
import pathlib
import subprocess
import sys

import pytest

TOOLS = sorted(p for p in (pathlib.Path(__file__).parent.parent.parent / "tools").glob("*.py")
               if p.name not in ("__init__.py", "procs.py"))


def test_every_tool_answers_help(tmp_path):
    assert len(TOOLS) >= 10
    env = dict(os.environ, PYTHONPATH=str(TOOLS[0].parent.parent))  # this checkout's kvroute, not an install's
    procs = {p.name: subprocess.Popen([sys.executable, str(p.resolve()), "--help"], cwd=p.parent.parent, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in TOOLS}
    failed = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"tools/{name} --help did not return")
        if proc.returncode != 0 or b"usage" not in out.lower():
            failed[name] = err.decode(errors="replace").strip().splitlines()[-1:] or out[:200]
    assert not failed, failed
    assert not (TOOLS[0].parent.parent / "--help").exists()
