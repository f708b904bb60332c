"""The one process harness: start a server as a child process, wait until it answers, stop it, always.

Everything that runs kvroute (or redis-server) as processes goes through here: `kvroute bench` and
`kvroute demo` (loadgen/local_cluster.py), `kvroute chaos` (loadgen/chaos/procs.py), the redis-server
of the tools and the tests (loadgen/redis_server.py), the benchmarks (kvroute/benchmarks/) and the
tests that start servers. A child runs in its own session (a signal reaches it and whatever it
started), writes its output to a log file, and is stopped with SIGTERM to its group, then SIGKILL
after a grace period: when its owner stops it, on error, or at interpreter exit (Ctrl-C included).

    with Processes() as procs:                       # logs in a temporary directory, kept on error
        url = procs.server("engine", "engine", "--backend", "sim")
        await procs.wait_ready(url)
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

import aiohttp

_live: set[subprocess.Popen] = set()


def _kill_all() -> None:
    for proc in list(_live):
        stop_process(proc)


atexit.register(_kill_all)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvroute_argv(*args: str) -> list[str]:
    """`python -m kvroute ARGS` with this interpreter (and so this checkout's code)."""
    return [sys.executable, "-m", "kvroute", *args]


def spawn(argv: list[str], log_path: str = os.devnull, env: dict | None = None) -> subprocess.Popen:
    """Start `argv` in its own session, output appended to `log_path`; killed at exit at the latest."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    _live.add(proc)
    return proc


def stop_process(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """SIGTERM the process group (woken first if it was SIGSTOPped), SIGKILL after `grace_s`; the exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            os.killpg(proc.pid, signal.SIGCONT)
            proc.wait(grace_s)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _live.discard(proc)
    return proc.returncode


async def wait_ready(url: str, path: str = "/health", timeout_s: float = 120.0,
                     watch: Iterable[subprocess.Popen] = (), logs: str = "") -> None:
    """Until GET `url + path` answers 200. RuntimeError if `timeout_s` passes first, or if a process of
    `watch` exits first (it will never answer); `logs` says where to look."""
    see = f"; see the logs in {logs}" if logs else ""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        while True:
            dead = next((p for p in watch if p.poll() is not None), None)
            if dead is not None:
                raise RuntimeError(f"a process exited (exit {dead.returncode}) before {url} answered{see}")
            try:
                async with session.get(url + path) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}{path} did not answer within {timeout_s:.0f} s{see}")
            await asyncio.sleep(0.1)


class Processes:
    """A group of child processes with one log directory (NAME.log each), stopped together in
    reverse order by `close`. A log directory of its own is removed when the group closes cleanly
    and kept (errors name it) otherwise."""

    def __init__(self, log_dir: str | None = None, env: dict | None = None, grace_s: float = 5.0) -> None:
        """`env`: added to this process's environment for every child; `grace_s`: how long `close`
        waits for each after SIGTERM."""
        self._own_log_dir = log_dir is None
        self.grace_s = grace_s
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="kvroute-procs-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.procs: list[subprocess.Popen] = []

    def log_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        proc = spawn(argv, self.log_path(name), {**self.env, **(env or {})})
        self.procs.append(proc)
        return proc

    def kvroute(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        """`kvroute ARGS` (a subcommand and its flags) with this interpreter."""
        return self.start(name, kvroute_argv(*args), env)

    def server(self, name: str, *args: str, env: dict | None = None) -> str:
        """`kvroute ARGS --port P` on a free port P; its URL."""
        port = free_port()
        self.kvroute(name, *args, "--port", str(port), env=env)
        return f"http://127.0.0.1:{port}"

    async def wait_ready(self, url: str, path: str = "/health", timeout_s: float = 120.0) -> None:
        """Until `url + path` answers 200; RuntimeError naming the logs if one of the group exits first."""
        await wait_ready(url, path, timeout_s, self.procs, self.log_dir)

    def stop(self, proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
        if proc in self.procs:
            self.procs.remove(proc)
        return stop_process(proc, grace_s)

    def close(self, grace_s: float | None = None) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, self.grace_s if grace_s is None else grace_s)
        self.procs.clear()

    def finish(self, ok: bool) -> None:
        """Close; a log directory of the group's own goes too when all went well (`ok`)."""
        self.close()
        if ok and self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.finish(exc_type is None)
