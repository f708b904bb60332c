"""Ctrl-C on a real `kvroute` process: exit 130, one line saying so, no traceback, and every process
it started stopped.

The signal goes to the command's whole process group, as a terminal's Ctrl-C does, so worker
processes sharing the group (the simulator's, the router's --workers) get it too.
"""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc")

ONE_SHOT = {  # the command line, and a stderr line showing it is at work (the signal comes then)
    "sim --suite": (["sim", "--suite", "--jobs", "2"], "on 8 instances"),
    "sim": (["sim", "--workload", "doc-qa", "--rate", "24", "--requests", "20000", "--policy", "kv_aware,oracle",
             "--jobs", "1"], "on 8 instances"),
    "chaos": (["chaos", "--out", "{tmp}/chaos"], "starting redis-server"),
    "bench": (["bench", "--engines", "2", "--policies", "round_robin", "--out", "{tmp}/bench"], "requests ->"),
}
SERVERS = {
    "engine": ["engine", "--backend", "sim", "--port", "0"],
    "router": ["router", "--engine", "http://127.0.0.1:9", "--port", "0"],
    "router --workers": ["router", "--engine", "http://127.0.0.1:9", "--port", "0", "--workers", "2"],
    "planner": ["planner", "--router", "http://127.0.0.1:9", "--port", "0"],
}


def _sigint_default() -> None:
    """In the child before it runs the command: SIGINT's default action, whatever this process has. A
    test run started in the background of a non-interactive shell (`pytest &`, nohup, some CI runners)
    ignores SIGINT, and an ignored signal stays ignored across exec: the command would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """`python -m kvroute ARGV` in its own process group, its stderr collected as it comes."""

    def __init__(self, argv: list[str], python_flags: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, *python_flags, "-m", "kvroute", *argv], cwd=ROOT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=_sigint_default)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, needle: str, timeout: float = 120.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while sum(needle in line for line in self.lines) < count:
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {needle!r}: {self.lines}"
            assert time.monotonic() < deadline, f"no {needle!r} in {timeout} s: {self.lines}"
            time.sleep(0.05)

    def interrupt(self) -> tuple[int, list[str]]:
        """Ctrl-C to the process group; the exit status and every stderr line, once it has ended."""
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(60)
        self._reader.join(10)
        return code, self.lines


@pytest.fixture
def start():
    """Start commands; whatever a failed test left running is killed, process group and all."""
    commands: list[Command] = []

    def start_(argv: list[str], python_flags: tuple[str, ...] = ()) -> Command:
        commands.append(Command(argv, python_flags))
        return commands[-1]

    yield start_
    for command in commands:
        if command.proc.poll() is None:
            os.killpg(command.proc.pid, signal.SIGKILL)
            command.proc.wait(10)


def _children(pid: int) -> set[int]:
    """The live processes whose parent is `pid`, and theirs."""
    found, parents = set(), {pid}
    while parents:
        parents = {int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) in parents}
        found |= parents
    return found


def _ppid(proc_dir: pathlib.Path) -> int | None:
    try:
        return int(proc_dir.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie is not)."""
    alive = set()
    for pid in pids:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _eventually_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


@pytest.mark.parametrize("name", ONE_SHOT)
def test_ctrl_c_is_one_line_and_exit_130(name, tmp_path, start):
    argv, busy = ONE_SHOT[name]
    command = start([a.format(tmp=tmp_path) for a in argv])
    command.wait_for_line(busy)
    started = _children(command.proc.pid)
    code, lines = command.interrupt()
    text = "\n".join(lines)
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert lines[-1].startswith(f"kvroute {name.split()[0]}: interrupted"), text
    assert sum("interrupted" in line for line in lines) == 1, text
    assert not _eventually_gone(started), f"still running after Ctrl-C: {_alive(started)}"


@pytest.mark.parametrize("name", SERVERS)
def test_ctrl_c_stops_a_server_with_exit_130(name, start):
    command = start(SERVERS[name])
    command.wait_for_line("listening on", count=2 if "--workers" in SERVERS[name] else 1)  # every worker
    started = _children(command.proc.pid)
    code, lines = command.interrupt()
    text = "\n".join(lines)
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "interrupted (SIGINT); stopping" in lines[-1], text
    assert not _eventually_gone(started), f"still running after Ctrl-C: {_alive(started)}"


def test_ctrl_c_while_starting_is_one_line(start):
    """Before the command is at work: the engine still importing what it serves with (-X importtime
    lists each import on stderr as it ends; the signal comes once the command's own have begun)."""
    command = start(["engine", "--backend", "sim", "--port", "0"], ("-X", "importtime"))
    command.wait_for_line("kvroute.router.contract.interrupt")
    code, lines = command.interrupt()
    text = "\n".join(lines)
    assert code == 130, text
    assert "Traceback" not in text, text
    assert "interrupted" in lines[-1], text
