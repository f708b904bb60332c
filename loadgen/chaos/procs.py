"""One server process of the chaos fleet: start, signal (kill -9, stop, continue, terminate)
and restart it with the same command line, so it comes back on the same port."""

from __future__ import annotations

import os
import signal
import subprocess

from kvroute.loadgen.processes import spawn, stop_process


class Proc:
    def __init__(self, name: str, argv: list[str], port: int, log_path: str, env: dict | None = None) -> None:
        self.name, self.argv, self.port, self.log_path, self.env = name, argv, port, log_path, env
        self.popen: subprocess.Popen | None = None
        self.expected_exit = False  # set before a deliberate kill, so a death is not mistaken for a crash

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Proc:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.popen = spawn(self.argv, self.log_path, self.env)
        self.expected_exit = False
        return self

    def send(self, sig: signal.Signals) -> None:
        """Signal the whole process group (the server and any helper it started)."""
        if self.popen is not None and self.alive:
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """kill -9, and reap it."""
        self.expected_exit = True
        self.send(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()

    def freeze(self) -> None:
        self.send(signal.SIGSTOP)

    def thaw(self) -> None:
        self.send(signal.SIGCONT)

    def terminate(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM (a graceful shutdown), SIGKILL after `grace_s`; the exit code."""
        self.expected_exit = True
        if self.popen is not None:
            stop_process(self.popen, grace_s)
            return self.popen.returncode
        return None

    def died(self) -> int | None:
        """The exit code if the process ended without being told to, else None."""
        if self.popen is None or self.expected_exit:
            return None
        return self.popen.poll()
